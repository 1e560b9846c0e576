"""Edge-read text: the split moved past the recognizer, for links too slow for a key frame's
pixels.

When the deadline policy finds that a key frame's patches at their finest coding do not fit
what the link carries by the deadline, the edge may read the frame itself (`EdgeReadPolicy`
in `transport.policy` decides, from measured quantities) and send the recognized lines: a
TEXT_LINES message of a few hundred bytes to a few KB instead of tens of KB of pixels.
`TextReader` runs rapidocr's recognizer on crops of the boxes the edge's detector already
found (`TextBoxes`: no second detection); `encode_text_lines` / `decode_text_lines` are the
payload codec (docs/wire-format.md): `decode_text_lines` returns a `KeyFrame` carrying the
lines (`KeyFrame.read_lines`), which the cloud's `OcrStage` emits as an `ocr` event with
`read_by` "edge", or raises `WireError` and nothing else, whatever the bytes.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamfuse.transport.patches import TextBoxes
from streamfuse.transport.wire import WireError
from streamfuse.vision.frames import BBox, KeyFrame, ReadLine

#: The cloud refuses a TEXT_LINES body inflating past this (a 1080p page of text is ~5 KB).
MAX_BODY_BYTES = 1 << 20
#: At most this many lines, each at most `MAX_LINE_CHARS` characters.
MAX_LINES = 4_096
MAX_LINE_CHARS = 4_096
#: Largest frame side a TEXT_LINES message may describe, pixels.
MAX_SIDE_PX = 16_384
#: The recognizer reads every line scaled to this height (PP-OCR's input), pixels.
REC_HEIGHT_PX = 48
_REASONS = ("first", "change", "timeout", "end")


def rec_width_px(boxes: Sequence[BBox]) -> float:
    """The recognizer's work for `boxes`: their total width once scaled to `REC_HEIGHT_PX`
    high (its cost is about linear in it)."""
    return float(sum(REC_HEIGHT_PX * (x1 - x0) / max(1, y1 - y0) for x0, y0, x1, y1 in boxes))


@dataclass(frozen=True, slots=True)
class EdgeReading:
    """What the edge read on one key frame: lines (text, box, recognizer score) in the
    detector's order, and the recognizer's wall and thread-CPU time."""

    lines: tuple[ReadLine, ...]
    read_s: float
    cpu_s: float


class TextReader:
    """rapidocr's recognizer on crops of boxes already detected (blocking: call it from a
    worker thread). Shares the detector's rapidocr instance and its settings (threads, the
    `min_conf` filter as `RapidOcrEngine` applies it)."""

    def __init__(self, detector: TextBoxes, *, min_conf: float = 0.5) -> None:
        self.detector = detector
        self.min_conf = min_conf
        self._rec: Any = None

    def load(self) -> float:
        """Load the recognizer and time one synthetic line on it; returns seconds per
        recognizer pixel of width (`rec_width_px`), the edge's prior for its read cost."""
        if self._rec is None:
            self._rec = self.detector.recognizer()
        line = np.full((REC_HEIGHT_PX, 960, 3), 245, dtype=np.uint8)
        line[14:34, 20:940:12] = 20  # strokes, so the recognizer decodes a real width
        self._recognize([line])  # the first run builds onnxruntime's buffers
        t0 = time.perf_counter()
        self._recognize([line])
        return (time.perf_counter() - t0) / 960.0

    def _recognize(self, crops: list[np.ndarray]) -> tuple[list[str], list[float]]:
        from rapidocr.ch_ppocr_rec import TextRecInput

        out = self._rec(TextRecInput(img=crops, return_word_box=False))
        txts = list(out.txts or ())
        scores = [float(s) for s in out.scores][: len(txts)]
        return [str(t) for t in txts], scores

    def __call__(
        self,
        image: np.ndarray,
        boxes: Sequence[BBox],
        quads: Sequence[np.ndarray] | None = None,
    ) -> EdgeReading:
        """Read the text in `boxes` (frame pixels) of `image` (RGB); with the detector's
        `quads` (`TextBoxes.regions`, one per box), each read straightened as rapidocr crops
        it (a camera's lines are tilted: a box's crop holds parts of the lines around it)."""
        from rapidocr.utils.process_img import get_rotate_crop_image

        if self._rec is None:
            self.load()
        t0, c0 = time.perf_counter(), time.thread_time()
        h, w = image.shape[:2]
        bgr = np.ascontiguousarray(image[..., ::-1])
        crops, kept = [], []
        for k, (x0, y0, x1, y1) in enumerate(boxes):
            x0, y0, x1, y1 = max(0, x0), max(0, y0), min(w, x1), min(h, y1)
            if x1 - x0 < 2 or y1 - y0 < 2:
                continue
            if quads is not None:
                crops.append(get_rotate_crop_image(bgr, np.array(quads[k], dtype=np.float32)))
            else:
                crops.append(np.ascontiguousarray(bgr[y0:y1, x0:x1]))
            kept.append((x0, y0, x1, y1))
        lines: list[ReadLine] = []
        if crops:
            txts, scores = self._recognize(crops)
            for (x0, y0, x1, y1), text, score in zip(kept, txts, scores, strict=False):
                if score >= self.min_conf and text.strip():
                    lines.append((text, (float(x0), float(y0), float(x1), float(y1)), score))
        return EdgeReading(tuple(lines), time.perf_counter() - t0, time.thread_time() - c0)


def encode_text_lines(
    key: KeyFrame, lines: Sequence[ReadLine], *, read_ms: float, det_side_px: int
) -> bytes:
    """The TEXT_LINES payload of `key` read at the edge as `lines` (docs/wire-format.md)."""
    w, h = key.size
    body = {
        "i": key.index,
        "t": round(key.t_media, 6),
        "w": w,
        "h": h,
        "tc": round(key.t_changed, 6),
        "r": key.reason,
        "ch": list(key.changed_bbox),
        "ms": round(read_ms, 1),
        "det": det_side_px,
        "l": [[t, [round(v) for v in b], round(c, 4)] for t, b, c in lines],
    }
    return zlib.compress(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(), 9)


def _int(body: dict[str, Any], name: str, lo: int, hi: int) -> int:
    v = body.get(name)
    if type(v) is not int or not lo <= v <= hi:
        raise WireError(f"text lines: {name}={v!r} is not an integer in [{lo}, {hi}]")
    return v


def _num(v: Any, name: str) -> float:
    if type(v) not in (int, float) or not math.isfinite(v):
        raise WireError(f"text lines: {name}={v!r} is not a finite number")
    return float(v)


def _box(v: Any, w: int, h: int) -> BBox:
    if not isinstance(v, list) or len(v) != 4 or any(type(c) is not int for c in v):
        raise WireError(f"text lines: box {v!r} is not 4 integers")
    x0, y0, x1, y1 = v
    if not (0 <= x0 <= x1 <= w and 0 <= y0 <= y1 <= h):
        raise WireError(f"text lines: box {v} outside the {w}x{h} frame")
    return (x0, y0, x1, y1)


def decode_text_lines(payload: bytes, *, stream_id: str, arrival_wall: float) -> KeyFrame:
    """The key frame (no pixels: a blank page of its size) and the lines the edge read, or
    `WireError` naming what is wrong with `payload`."""
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(payload, MAX_BODY_BYTES)
        if inflate.unconsumed_tail:
            raise WireError(f"text lines inflate past {MAX_BODY_BYTES} bytes")
        if not inflate.eof or inflate.unused_data:
            raise WireError("text lines: truncated or trailing bytes after the deflate stream")
        body = json.loads(raw.decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WireError(f"text lines payload is not deflated JSON: {e}") from e
    if not isinstance(body, dict):
        raise WireError("text lines payload is not a JSON object")
    w = _int(body, "w", 1, MAX_SIDE_PX)
    h = _int(body, "h", 1, MAX_SIDE_PX)
    index = _int(body, "i", 0, 2**63 - 1)
    det = _int(body, "det", 32, MAX_SIDE_PX)
    t = _num(body.get("t"), "t")
    t_changed = _num(body.get("tc"), "tc")
    read_ms = _num(body.get("ms"), "ms")
    if read_ms < 0:
        raise WireError(f"text lines: ms={read_ms} is negative")
    reason = body.get("r")
    if reason not in _REASONS:
        raise WireError(f"text lines: reason {reason!r} (expected one of {_REASONS})")
    changed = _box(body.get("ch"), w, h)
    raw_lines = body.get("l")
    if not isinstance(raw_lines, list) or len(raw_lines) > MAX_LINES:
        raise WireError(f"text lines: 'l' is not a list of at most {MAX_LINES} lines")
    lines: list[ReadLine] = []
    for item in raw_lines:
        if not isinstance(item, list) or len(item) != 3:
            raise WireError(f"text lines: line {str(item)[:60]!r} is not [text, box, conf]")
        text, box, conf = item
        if not isinstance(text, str) or len(text) > MAX_LINE_CHARS:
            raise WireError("text lines: a line's text is not a string of at most 4096 chars")
        c = _num(conf, "conf")
        if not 0.0 <= c <= 1.0:
            raise WireError(f"text lines: conf {c} outside [0, 1]")
        x0, y0, x1, y1 = _box(box, w, h)
        lines.append((text, (float(x0), float(y0), float(x1), float(y1)), c))
    # No pixels: a zero-stride white page of the frame's size (no memory), for `size`.
    blank = np.broadcast_to(np.uint8(255), (h, w, 3))
    return KeyFrame(
        stream_id=stream_id,
        t_media=t,
        arrival_wall=arrival_wall,
        image=blank,
        index=index,
        changed_bbox=changed,
        t_changed=t_changed,
        reason=reason,
        read_lines=tuple(lines),
        read_ms=read_ms,
        read_det_side_px=det,
    )


__all__ = [
    "MAX_BODY_BYTES",
    "EdgeReading",
    "TextReader",
    "decode_text_lines",
    "encode_text_lines",
    "rec_width_px",
]
