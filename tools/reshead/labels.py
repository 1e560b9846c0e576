"""Labels for the resolution head: the lowest ladder rung at which OCR still reads a slide.

`RungLabeler` reads a frame at each rung the way the OCR stage does (`mode="det"`, default:
rapidocr's detector input limited to the rung's long side, recognition on crops of the full
frame; `mode="frame"`: the whole frame downsized to fit the rung first), and scores the text
against the truth with a character error rate on whitespace-free text. The label is the
smallest rung whose read has CER <= `max_cer` (the top rung, flagged unreadable, when none
does). The search starts from a guess and walks down or up, assuming correctness is monotone in
scale, so a frame usually costs two or three OCR runs instead of seven.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from PIL import Image

from streamfuse.errors import ConfigError, ModelError
from streamfuse.qos.ladder import DEFAULT_LADDER, Ladder
from streamfuse.text import cer

log = logging.getLogger(__name__)

DEFAULT_MAX_CER = 0.02


def resize_to_rung(image: np.ndarray, width_px: int, height_px: int) -> np.ndarray:
    """Fit an RGB frame inside `width_px` x `height_px` (area-averaging down, never up)."""
    h, w = image.shape[:2]
    s = min(1.0, width_px / w, height_px / h)
    if s >= 1.0:
        return image
    size = (max(1, round(w * s)), max(1, round(h * s)))
    return np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BOX))


def make_ocr_engine(limit_side_len: int = 1920, threads: int = -1) -> Any:
    """A rapidocr engine with the project's tuned settings; its logger quieted.

    `threads` sets onnxruntime's intra-op threads (-1: onnxruntime's default).
    """
    try:
        from rapidocr import RapidOCR
    except ImportError as e:  # pragma: no cover - rapidocr is a hard dependency
        raise ModelError("rapidocr is not installed; `pip install rapidocr==3.10.0`") from e
    logging.getLogger("RapidOCR").setLevel(logging.ERROR)
    return RapidOCR(
        params={
            "Global.use_cls": False,
            "Det.limit_type": "max",
            "Det.limit_side_len": limit_side_len,
            "Global.log_level": "error",
            "EngineConfig.onnxruntime.intra_op_num_threads": threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1 if threads > 0 else -1,
        }
    )


def ocr_text(engine: Any, image: np.ndarray, limit_side_len: int | None = None) -> str:
    """Run rapidocr on an RGB frame; lines joined in the detector's reading order."""
    det = getattr(engine, "text_det", None)
    if det is None and hasattr(engine, "_load_det_model"):
        det = engine._load_det_model()  # rapidocr loads the detector lazily
    if limit_side_len is not None and det is not None:
        # The detector rebuilds its pre-processing from this attribute on every call.
        det.limit_side_len = limit_side_len
    # rapidocr expects BGR arrays (OpenCV convention).
    out = engine(np.ascontiguousarray(image[:, :, ::-1]))
    txts = getattr(out, "txts", None) or ()
    return "\n".join(str(t) for t in txts)


@dataclass(frozen=True, slots=True)
class RungResult:
    rung_index: int
    cer: float
    seconds: float


@dataclass(frozen=True, slots=True)
class LabelResult:
    """The label (lowest correct rung index, largest = 0) and the rungs actually tried."""

    label: int
    tried: tuple[RungResult, ...]
    readable: bool


class RungLabeler:
    """Finds the lowest rung at which OCR reads a frame's text with CER <= `max_cer`."""

    def __init__(
        self,
        ladder: Ladder = DEFAULT_LADDER,
        max_cer: float = DEFAULT_MAX_CER,
        engine: Any | None = None,
        threads: int = -1,
        mode: Literal["det", "frame"] = "det",
    ) -> None:
        if mode not in ("det", "frame"):
            raise ConfigError(f"mode must be 'det' or 'frame', got {mode!r}")
        self.mode = mode
        self.ladder = ladder
        self.max_cer = max_cer
        self.engine = (
            engine if engine is not None else make_ocr_engine(ladder[0].long_side_px, threads)
        )

    def read_at(self, image: np.ndarray, rung_index: int, truth: str) -> RungResult:
        rung = self.ladder[rung_index]
        h, w = image.shape[:2]
        if self.mode == "frame":
            image = resize_to_rung(image, rung.width_px, rung.height_px)
        # Detector long side: what fitting the frame inside the rung gives.
        det_side = max(rung.size_for(w, h))
        t0 = time.process_time()
        text = ocr_text(self.engine, image, det_side)
        return RungResult(
            rung_index, cer(truth, text, ignore_whitespace=True), time.process_time() - t0
        )

    def label(
        self, image: np.ndarray, lines: Sequence[str], start: int | None = None
    ) -> LabelResult:
        """Lowest rung (highest index) that reads `lines` correctly.

        Without `start`, rungs are tried from the smallest up. With a `start` guess, the search
        walks down from it while reads stay correct, or up from it until one is correct, which
        usually needs two OCR runs instead of up to seven. Both assume correctness is monotone
        in scale.
        """
        truth = "\n".join(lines)
        tried: dict[int, RungResult] = {}

        def ok(idx: int) -> bool:
            if idx not in tried:
                tried[idx] = self.read_at(image, idx, truth)
            return tried[idx].cer <= self.max_cer

        def done(label: int, readable: bool) -> LabelResult:
            return LabelResult(label, tuple(tried[i] for i in sorted(tried)), readable)

        lowest = self.ladder.lowest
        idx = lowest if start is None else self.ladder.clamp(start)
        if ok(idx):
            while idx < lowest and ok(idx + 1):
                idx += 1
            return done(idx, True)
        while idx > 0:
            idx -= 1
            if ok(idx):
                return done(idx, True)
        return done(0, False)


def guess_rung(
    ladder: Ladder, text_px: float, frame_w: int, frame_h: int, min_px: float = 6.0
) -> int:
    """Smallest rung at which `text_px`-high text stays at least `min_px` high (a search hint)."""
    for idx in range(ladder.lowest, -1, -1):
        if text_px * ladder[idx].scale_for(frame_w, frame_h) >= min_px:
            return idx
    return 0
