"""Sparse patch tokens of a key frame: the edge keeps the patches that hold text, ranked by
importance; the cloud reassembles a picture the OCR reads as it would the original.

`encode_patches(frame, text_boxes, keep_ratio, config) -> PatchMessage` ranks the frame's
`patch_px` grid by text coverage (and change since the previous key frame), keeps the top
`keep_ratio` of the grid (never a patch without text), quantizes each kept patch to a few grey
levels between its own darkest and brightest pixel, and codes them as one grey atlas (PNG or
JPEG) plus a run-length coded bitmap and the per-patch grey ranges. `decode_patches(payload,
shape)` inverts it into a `KeyFrame` (same media time, index, changed region and reason as the
edge's).
"""

from __future__ import annotations

import io
import json
import math
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from streamfuse.transport.config import TransportConfig
from streamfuse.transport.wire import WireError
from streamfuse.vision.frames import BBox, KeyFrame

#: Patches per row of the atlas (wide rows keep a text line's patches side by side).
ATLAS_COLS = 64


@dataclass(frozen=True, slots=True)
class PatchMessage:
    payload: bytes
    #: (grid rows, grid cols, patch px): the header's shape.
    shape: tuple[int, int, int]
    keep_ratio: float
    kept: int
    candidates: int


def importance(
    size_wh: tuple[int, int], text_boxes: list[BBox], changed: BBox, patch_px: int, pad_px: int
) -> np.ndarray:
    """Per grid cell: fraction of it covered by (padded) text, plus 0.25 where it changed
    (changed text is read first); 0 for cells without text."""
    w, h = size_wh
    rows, cols = math.ceil(h / patch_px), math.ceil(w / patch_px)
    cover = np.zeros((rows * patch_px, cols * patch_px), dtype=np.float32)
    for x0, y0, x1, y1 in text_boxes:
        cover[max(0, y0 - pad_px) : y1 + pad_px, max(0, x0 - pad_px) : x1 + pad_px] = 1.0
    cover = cover[: rows * patch_px, : cols * patch_px]
    score = cover.reshape(rows, patch_px, cols, patch_px).mean(axis=(1, 3))
    cx0, cy0, cx1, cy1 = changed
    if cx1 > cx0 and cy1 > cy0:
        bonus = np.zeros_like(score)
        bonus[
            cy0 // patch_px : math.ceil(cy1 / patch_px), cx0 // patch_px : math.ceil(cx1 / patch_px)
        ] = 0.25
        score = np.where(score > 0, score + bonus, 0.0)
    return score


def noise_sigma(grey: np.ndarray) -> float:
    """Robust estimate of pixel noise, grey levels: the median absolute difference from a 3x3
    median (1.4826 x MAD), on a subsample. ~0 on rendered slides, ~sigma on a camera's."""
    h, w = grey.shape
    step = max(1, min(h, w) // 256)
    small = np.ascontiguousarray(grey[::step, ::step])
    residual = np.abs(small.astype(np.int16) - cv2.medianBlur(small, 3).astype(np.int16))
    return 1.4826 * float(np.median(residual))


def _palette_png(image: np.ndarray, levels: int) -> bytes:
    """A grey image holding only `levels` evenly spread values, as a 1/2/4-bit palette PNG
    (its palette maps each index back to the grey value, so any PNG reader sees grey)."""
    from PIL import Image

    steps = levels - 1
    index = np.rint(image.astype(np.float32) * steps / 255).astype(np.uint8)
    palette = [round(i * 255 / steps) for i in range(levels) for _ in range(3)]
    picture = Image.fromarray(index, mode="P")
    picture.putpalette(palette)
    bits = 1 if levels <= 2 else 2 if levels <= 4 else 4
    out = io.BytesIO()
    picture.save(out, format="PNG", optimize=True, bits=bits)
    return out.getvalue()


def rle_encode(bits: np.ndarray) -> bytes:
    """Run lengths of a flat bool array, alternating and starting with a run of 0s, as LEB128
    varints."""
    flat = np.asarray(bits, dtype=bool).ravel()
    out = bytearray()
    edges = np.flatnonzero(np.diff(flat.astype(np.int8))) + 1
    bounds = np.concatenate([[0], edges, [flat.size]])
    runs = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        runs.insert(0, 0)
    for run in runs:
        while True:
            byte = run & 0x7F
            run >>= 7
            out.append(byte | (0x80 if run else 0))
            if not run:
                break
    return bytes(out)


def rle_decode(data: bytes, n_bits: int) -> np.ndarray:
    """Inverse of `rle_encode` (raises `WireError` when the runs do not add up to `n_bits`)."""
    bits = np.zeros(n_bits, dtype=bool)
    pos, value, run, shift = 0, False, 0, 0
    for byte in data:
        run |= (byte & 0x7F) << shift
        shift += 7
        if shift > 35:
            raise WireError("patch mask: varint too long")
        if byte & 0x80:
            continue
        if pos + run > n_bits:
            raise WireError(f"patch mask: runs exceed {n_bits} cells")
        if value:
            bits[pos : pos + run] = True
        pos += run
        value, run, shift = not value, 0, 0
    if shift or pos != n_bits:
        raise WireError(f"patch mask: runs cover {pos} of {n_bits} cells")
    return bits


def encode_patches(
    frame: KeyFrame, text_boxes: list[BBox], keep_ratio: float, config: TransportConfig
) -> PatchMessage:
    p = config.patch_px
    w, h = frame.size
    rows, cols = math.ceil(h / p), math.ceil(w / p)
    score = importance((w, h), text_boxes, frame.changed_bbox, p, config.text_pad_px)
    flat = score.ravel()
    candidates = int(np.count_nonzero(flat))
    k = min(candidates, math.ceil(keep_ratio * flat.size))
    keep = np.zeros(flat.size, dtype=bool)
    if k:
        keep[np.argsort(-flat, kind="stable")[:k]] = True
    grey = cv2.cvtColor(frame.image, cv2.COLOR_RGB2GRAY)
    if (
        config.denoise_px > 1
        and config.grey_levels < 256
        and noise_sigma(grey) >= config.denoise_min_sigma
    ):
        k_px = config.denoise_px | 1
        grey = cv2.GaussianBlur(grey, (k_px, k_px), 0)
    background = int(np.median(grey[:: max(1, h // 64), :: max(1, w // 64)]))
    padded = np.full((rows * p, cols * p), background, dtype=np.uint8)
    padded[:h, :w] = grey
    tiles = padded.reshape(rows, p, cols, p).transpose(0, 2, 1, 3).reshape(rows * cols, p, p)
    kept = tiles[keep]
    lo = kept.min(axis=(1, 2)) if k else np.zeros(0, dtype=np.uint8)
    hi = kept.max(axis=(1, 2)) if k else np.zeros(0, dtype=np.uint8)
    if config.grey_levels < 256 and k:
        # Per patch: `grey_levels` steps from its darkest to its brightest pixel, spread over
        # 0..255 so the atlas holds only that many distinct values (PNG's deflate likes it).
        span = np.maximum(hi - lo, 1).astype(np.float32)[:, None, None]
        steps = config.grey_levels - 1
        q = np.rint((kept.astype(np.float32) - lo[:, None, None]) / span * steps)
        kept = (q * (255 / steps)).round().astype(np.uint8)
    atlas = b""
    if k:
        a_rows = math.ceil(k / ATLAS_COLS)
        a_cols = min(k, ATLAS_COLS)
        sheet = np.full((a_rows * a_cols, p, p), background, dtype=np.uint8)
        sheet[:k] = kept
        image = (
            sheet.reshape(a_rows, a_cols, p, p)
            .transpose(0, 2, 1, 3)
            .reshape(a_rows * p, a_cols * p)
        )
        if config.patch_codec == "png" and config.grey_levels <= 16:
            atlas = _palette_png(image, config.grey_levels)
        else:
            if config.patch_codec == "jpeg":
                params = [cv2.IMWRITE_JPEG_QUALITY, config.jpeg_quality]
                ok, buf = cv2.imencode(".jpg", image, params)
            else:
                ok, buf = cv2.imencode(".png", image, [cv2.IMWRITE_PNG_COMPRESSION, 9])
            if not ok:
                raise WireError("cannot code the patch atlas")
            atlas = buf.tobytes()
    meta = {
        "t": frame.t_media,
        "index": frame.index,
        "w": w,
        "h": h,
        "bg": background,
        "changed_bbox": list(frame.changed_bbox),
        "changed_frac": frame.changed_frac,
        "content_bbox": None if frame.content_bbox is None else list(frame.content_bbox),
        "t_changed": frame.t_changed,
        "reason": frame.reason,
        "levels": config.grey_levels,
    }
    meta_b = json.dumps(meta, separators=(",", ":")).encode()
    mask = rle_encode(keep)
    # Many patches share a range (ink on paper): deflate takes the per-patch ranges to ~1/3.
    ranges = zlib.compress(lo.astype(np.uint8).tobytes() + hi.astype(np.uint8).tobytes(), 9)
    payload = b"".join(
        [
            struct.pack("!I", len(meta_b)),
            meta_b,
            struct.pack("!I", len(mask)),
            mask,
            struct.pack("!I", len(ranges)),
            ranges,
            atlas,
        ]
    )
    return PatchMessage(payload, (rows, cols, p), k / flat.size, k, candidates)


def decode_patches(
    payload: bytes, shape: tuple[int, ...], *, stream_id: str, arrival_wall: float
) -> KeyFrame:
    """The key frame rebuilt from a VIDEO_PATCHES message (raises `WireError` if malformed)."""
    if len(shape) != 3:
        raise WireError(f"patch message shape {shape} (expected rows, cols, patch px)")
    rows, cols, p = shape
    try:
        (n_meta,) = struct.unpack_from("!I", payload)
        meta: dict[str, Any] = json.loads(payload[4 : 4 + n_meta])
        (n_mask,) = struct.unpack_from("!I", payload, 4 + n_meta)
        start = 8 + n_meta
        keep = rle_decode(payload[start : start + n_mask], rows * cols)
        k = int(keep.sum())
        start += n_mask
        (n_ranges,) = struct.unpack_from("!I", payload, start)
        start += 4
        ranges = np.frombuffer(
            zlib.decompressobj().decompress(payload[start : start + n_ranges], 2 * k + 1),
            dtype=np.uint8,
        )
        if len(ranges) != 2 * k:
            raise WireError("patch message: grey ranges do not match the mask")
        atlas_b = payload[start + n_ranges :]
        w, h, bg = int(meta["w"]), int(meta["h"]), int(meta["bg"])
        levels = int(meta.get("levels", 256))
    except (struct.error, ValueError, KeyError, TypeError, zlib.error) as e:
        raise WireError(f"malformed patch message: {e}") from e
    if not (0 < w <= cols * p and 0 < h <= rows * p and 0 <= bg <= 255):
        raise WireError(f"patch message of {w}x{h} does not fit its {rows}x{cols} grid")
    canvas = np.full((rows * cols, p, p), bg, dtype=np.uint8)
    if k:
        atlas = cv2.imdecode(np.frombuffer(atlas_b, dtype=np.uint8), cv2.IMREAD_GRAYSCALE)
        a_cols = min(k, ATLAS_COLS)
        a_rows = math.ceil(k / ATLAS_COLS)
        if atlas is None or atlas.shape != (a_rows * p, a_cols * p):
            raise WireError("patch atlas does not decode to the announced patches")
        tiles = atlas.reshape(a_rows, p, a_cols, p).transpose(0, 2, 1, 3).reshape(-1, p, p)[:k]
        if 2 <= levels < 256:
            lo = ranges[:k].astype(np.float32)[:, None, None]
            span = np.maximum(ranges[k:].astype(np.float32) - ranges[:k], 1)[:, None, None]
            tiles = np.clip(np.rint(lo + tiles.astype(np.float32) / 255 * span), 0, 255)
        canvas[keep] = tiles.astype(np.uint8)
    grey = canvas.reshape(rows, cols, p, p).transpose(0, 2, 1, 3).reshape(rows * p, cols * p)
    rgb = np.ascontiguousarray(np.repeat(grey[:h, :w, None], 3, axis=2))
    content = meta.get("content_bbox")
    return KeyFrame(
        stream_id=stream_id,
        t_media=float(meta["t"]),
        arrival_wall=arrival_wall,
        image=rgb,
        index=int(meta["index"]),
        changed_bbox=tuple(int(v) for v in meta["changed_bbox"]),  # type: ignore[arg-type]
        changed_frac=float(meta["changed_frac"]),
        content_bbox=None if content is None else tuple(int(v) for v in content),  # type: ignore[arg-type]
        t_changed=float(meta["t_changed"]),
        reason=meta["reason"],
    )


class TextBoxes:
    """The edge's text detector: rapidocr's PP-OCR detector alone (no recognizer), boxes in
    frame pixels. Loaded on first use; blocking (call it from a worker thread)."""

    def __init__(self, det_max_side_px: int = 960, threads: int = 1) -> None:
        self.det_max_side_px = det_max_side_px
        self.threads = threads
        self._det: Any = None

    def load(self) -> None:
        if self._det is not None:
            return
        from rapidocr import RapidOCR

        from streamfuse.vision.config import OcrConfig
        from streamfuse.vision.ocr import RapidOcrEngine

        params = RapidOcrEngine(OcrConfig(intra_op_threads=self.threads)).params()
        params["Det.limit_side_len"] = self.det_max_side_px
        engine = RapidOCR(params=params)
        engine(np.full((48, 160, 3), 255, dtype=np.uint8))  # rapidocr builds its models lazily
        if getattr(engine, "text_det", None) is None:
            from streamfuse.errors import ModelError

            raise ModelError("rapidocr did not load its text detector")
        self._det = engine.text_det

    def __call__(self, image: np.ndarray) -> list[BBox]:
        self.load()
        h, w = image.shape[:2]
        out = self._det(np.ascontiguousarray(image[..., ::-1]))
        boxes: list[BBox] = []
        for quad in [] if out.boxes is None else out.boxes:
            q = np.asarray(quad, dtype=np.float64).reshape(-1, 2)
            x0, y0 = max(0, math.floor(q[:, 0].min())), max(0, math.floor(q[:, 1].min()))
            x1, y1 = min(w, math.ceil(q[:, 0].max())), min(h, math.ceil(q[:, 1].max()))
            if x1 > x0 and y1 > y0:
                boxes.append((x0, y0, x1, y1))
        return boxes


__all__ = ["PatchMessage", "TextBoxes", "decode_patches", "encode_patches", "importance"]
