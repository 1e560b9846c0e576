"""A model cut across the link (F10): an intermediate tensor sent as FP32, INT8 or FP8 (e4m3).

`quantize(x, dtype) -> (payload, scale)` / `dequantize(payload, shape, dtype, scale)` are the
symmetric per-tensor codes the wire header describes (dtype, shape, quant scale); `tensor_packet`
builds that header. `WhisperSplit` runs Whisper's encoder on the edge and its decoder in the
cloud from the received encoder output (CTranslate2 exposes both halves), so the accuracy cost of
each code can be measured (benchmarks/edge_cloud.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from streamfuse.transport.wire import DType, Modality, Packet, WireError

#: The largest finite float8 e4m3fn value.
FP8_E4M3_MAX = 448.0


def quantize(x: np.ndarray, dtype: DType) -> tuple[bytes, float]:
    """`x` (float32) as FLOAT32, INT8 (round(x / scale), scale = max|x| / 127) or FLOAT8_E4M3
    (x / scale in e4m3, scale = max|x| / 448); returns (payload, scale)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    peak = float(np.abs(x).max()) if x.size else 0.0
    if dtype is DType.FLOAT32:
        return x.tobytes(), 1.0
    if dtype is DType.INT8:
        scale = peak / 127.0 or 1.0
        return np.clip(np.rint(x / scale), -127, 127).astype(np.int8).tobytes(), scale
    if dtype is DType.FLOAT8_E4M3:
        import torch

        scale = peak / FP8_E4M3_MAX or 1.0
        f8 = torch.from_numpy(x / scale).to(torch.float8_e4m3fn)
        return f8.view(torch.uint8).numpy().tobytes(), scale
    raise WireError(f"cannot quantize to {dtype.name} (FLOAT32, INT8 or FLOAT8_E4M3)")


def dequantize(payload: bytes, shape: tuple[int, ...], dtype: DType, scale: float) -> np.ndarray:
    """The float32 tensor of a TENSOR message (raises `WireError` if the sizes disagree)."""
    n = int(np.prod(shape)) if shape else 1
    width = {DType.FLOAT32: 4, DType.INT8: 1, DType.FLOAT8_E4M3: 1}.get(dtype)
    if width is None:
        raise WireError(f"tensor dtype {dtype.name} is not decoded here")
    if len(payload) != n * width:
        raise WireError(
            f"tensor {shape} of {dtype.name} needs {n * width} bytes, got {len(payload)}"
        )
    if dtype is DType.FLOAT32:
        return np.frombuffer(payload, dtype=np.float32).reshape(shape).copy()
    if dtype is DType.INT8:
        return np.frombuffer(payload, dtype=np.int8).reshape(shape).astype(np.float32) * scale
    import torch

    raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(torch.float8_e4m3fn)
    return raw.to(torch.float32).numpy().reshape(shape) * scale


def tensor_packet(x: np.ndarray, dtype: DType, media_time_s: float = 0.0) -> tuple[Packet, bytes]:
    """The header template and payload of a TENSOR message carrying `x`."""
    payload, scale = quantize(x, dtype)
    header = Packet(
        modality=Modality.TENSOR,
        dtype=dtype,
        shape=tuple(int(d) for d in x.shape),
        quant_scale=scale,
        media_time_us=round(media_time_s * 1e6),
    )
    return header, payload


class WhisperSplit:
    """Whisper cut after its encoder: `encode` (edge) -> tensor (1, 1500, d_model) for 30 s of
    16 kHz audio -> `decode` (cloud), greedy, without timestamps."""

    def __init__(self, path: str | Path, *, compute_type: str = "int8", threads: int = 1) -> None:
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer

        self.model: Any = WhisperModel(
            str(path), device="cpu", compute_type=compute_type, cpu_threads=threads
        )
        self.tokenizer: Any = Tokenizer(
            self.model.hf_tokenizer,
            bool(self.model.model.is_multilingual),
            task="transcribe",
            language="en",
        )

    def encode(self, audio: np.ndarray) -> np.ndarray:
        """Encoder output for up to 30 s of audio (padded to 30 s, as Whisper expects)."""
        features = self.model.feature_extractor(np.asarray(audio, dtype=np.float32))
        frames = 3000
        features = features[..., :frames]
        if features.shape[-1] < frames:
            features = np.pad(features, ((0, 0), (0, frames - features.shape[-1])))
        return np.array(self.model.encode(np.ascontiguousarray(features)))

    def decode(self, encoded: np.ndarray) -> str:
        import ctranslate2

        tok = self.tokenizer
        view = ctranslate2.StorageView.from_array(np.ascontiguousarray(encoded, dtype=np.float32))
        prompt = [*tok.sot_sequence, tok.no_timestamps]
        result = self.model.model.generate(view, [prompt], beam_size=1, max_length=224)
        return str(tok.decode([t for t in result[0].sequences_ids[0] if t < tok.eot])).strip()


__all__ = ["FP8_E4M3_MAX", "WhisperSplit", "dequantize", "quantize", "tensor_packet"]
