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
import lzma
import math
import struct
from collections.abc import Mapping
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
    #: The scale the frame was sent at (`text_scale`); the cloud enlarges it back.
    scale: float = 1.0
    #: Patches not sent: the cloud copies them from the reference key frame.
    reused: int = 0
    #: Grey levels each sent patch was quantized to.
    levels: int = 0
    #: The frame's finest coding with every text patch (not sent coarser, nothing cut).
    complete: bool = True


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


def text_scale(text_boxes: list[BBox], config: TransportConfig, *, noisy: bool = False) -> float:
    """The scale the frame is sent at: its smallest text line (detected box height, boxes under
    8 px ignored as noise) comes out `text_px` tall, never enlarged, never under `min_scale`.
    The cloud's recognizer resizes every line to 48 px anyway: pixels beyond what the glyphs
    need are bytes spent on nothing."""
    heights = [y1 - y0 for _x0, y0, _x1, y1 in text_boxes if y1 - y0 >= 8]
    target = config.noisy_text_px if noisy else config.text_px
    if target <= 0 or not heights:
        return 1.0
    return max(config.min_scale, min(1.0, target / min(heights)))


def _pack(indices: np.ndarray, bits: int) -> bytes:
    """Values < 2**bits, `8 // bits` per byte, first in the high bits."""
    per = 8 // bits
    flat = indices.ravel().astype(np.uint8)
    if flat.size % per:
        flat = np.concatenate([flat, np.zeros(per - flat.size % per, dtype=np.uint8)])
    groups = flat.reshape(-1, per)
    out = np.zeros(groups.shape[0], dtype=np.uint8)
    for i in range(per):
        out |= groups[:, i] << (bits * (per - 1 - i))
    return out.tobytes()


def _unpack(data: bytes, bits: int, n: int) -> np.ndarray:
    per = 8 // bits
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size * per < n:
        raise WireError(f"patch atlas: {raw.size} bytes hold fewer than {n} pixels")
    shifts = np.array([bits * (per - 1 - i) for i in range(per)], dtype=np.uint8)
    values = (raw[:, None] >> shifts) & ((1 << bits) - 1)
    return values.ravel()[:n]


def _bits(levels: int) -> int:
    return 1 if levels <= 2 else 2 if levels <= 4 else 4


@dataclass(frozen=True, slots=True)
class Reference:
    """A key frame the cloud holds: its index and its rebuilt grey image (full size)."""

    index: int
    grey: np.ndarray


#: The cloud keeps this many rebuilt key frames for later ones to copy patches from; the edge
#: refers only to one of its last this many key frames (older ones may be gone there).
REFERENCES_HELD = 4
#: Largest camera shift (pixels) between key frames that patches are still copied across.
MAX_SHIFT_PX = 24.0


def global_shift(grey: np.ndarray, reference: np.ndarray) -> tuple[float, float] | None:
    """(dx, dy) that moves `reference` onto `grey` (phase correlation on a half-size copy,
    sub-pixel), or None when no clear single shift explains the difference (a new picture)."""
    a = cv2.resize(grey, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA).astype(np.float32)
    b = cv2.resize(reference, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA)
    window = cv2.createHanningWindow((a.shape[1], a.shape[0]), cv2.CV_32F)
    (dx, dy), response = cv2.phaseCorrelate(b.astype(np.float32), a, window)
    if response < 0.05 or abs(dx) * 2 > MAX_SHIFT_PX or abs(dy) * 2 > MAX_SHIFT_PX:
        return None
    return 2.0 * dx, 2.0 * dy


def _shifted(grey: np.ndarray, shift: tuple[float, float], size: tuple[int, int]) -> np.ndarray:
    """`grey` moved by `shift` (bilinear, edges repeated), then resized to `size` (w, h)."""
    h, w = grey.shape
    m = np.array([[1, 0, shift[0]], [0, 1, shift[1]]], dtype=np.float32)
    moved = cv2.warpAffine(grey, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    if size != (w, h):
        moved = cv2.resize(moved, size, interpolation=cv2.INTER_AREA)
    return moved


def _matches(new: np.ndarray, old: np.ndarray, max_diff: float) -> np.ndarray:
    """Per patch pair: would the cloud's copy read as the new patch? Both cut at the new
    patch's mid-grey; at most `max_diff` of the pixels may fall on the other side, and the
    copy must have (at least half) the new patch's contrast (ink where there is ink)."""
    lo = new.min(axis=(1, 2)).astype(np.int16)
    hi = new.max(axis=(1, 2)).astype(np.int16)
    mid = ((lo + hi) // 2)[:, None, None]
    differ = ((new > mid) != (old > mid)).mean(axis=(1, 2))
    span_old = old.max(axis=(1, 2)).astype(np.int16) - old.min(axis=(1, 2))
    flat = (hi - lo) < 24  # paper only: the copy must be paper of about the same grey too
    same_paper = np.abs(old.mean(axis=(1, 2)) - new.mean(axis=(1, 2))) < 12
    ink = (differ <= max_diff) & (span_old * 2 >= hi - lo)
    return np.where(flat, same_paper & (span_old < 24), ink)


#: LZMA2 over the whole message body: the per-patch pixels of text repeat (the same glyph
#: strokes, the same paper), which a long-window coder finds and deflate's 32 KB window less so.
#: Preset 6: on 1080p text, as small as 9 or 9-extreme (within 1%) at 60% of their time.
_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 6}]
#: Largest decoded body accepted (a 4K frame of 8-bit patches plus metadata): a corrupt or
#: hostile message must not make the cloud inflate gigabytes.
_MAX_BODY = 4096 * 2304 + 65_536


def encode_patches(
    frame: KeyFrame,
    text_boxes: list[BBox],
    keep_ratio: float,
    config: TransportConfig,
    reference: Reference | None = None,
    scale_factor: float = 1.0,
    noisy_levels: int | None = None,
    band: tuple[float, float] | None = None,
) -> PatchMessage:
    """`reference`: a key frame the cloud holds; patches that match it (after the camera's
    global shift) are not sent but copied from it there. `scale_factor`: the frame goes this
    much smaller than `text_scale` says (the keep policy's coarser steps). `noisy_levels`: a
    noisy frame keeps its own coding (`noisy_text_px`), `scale_factor` smaller, at this many
    grey levels (clean frames keep `grey_levels`); None: a noisy frame sent coarser drops to
    `grey_levels` and the clean frames' `text_px` (the keep policy's steps before the
    measured ladder, docs/edge-cloud.md). `band` (from, to), shares of the frame's text
    patches counted from the top: only the rows of patches holding that share of the text
    are sent; the cloud keeps its copy of this same frame (`reference`, full size, no shift)
    everywhere else, pixel for pixel: one part of a refinement (`transport.refine`)."""
    p = config.patch_px
    w, h = frame.size
    grey = cv2.cvtColor(frame.image, cv2.COLOR_RGB2GRAY)
    noisy = noise_sigma(grey) >= config.denoise_min_sigma
    # The noisy coding: more grey levels, smaller.
    fine = noisy and (scale_factor >= 1.0 or noisy_levels is not None)
    scale = max(config.min_scale, text_scale(text_boxes, config, noisy=fine) * scale_factor)
    sw, sh = max(1, round(w * scale)), max(1, round(h * scale))
    if config.denoise_px > 1 and config.noisy_grey_levels < 256 and noisy:
        k_px = config.denoise_px | 1
        grey = cv2.GaussianBlur(grey, (k_px, k_px), 0)
    shifted: np.ndarray | None = None
    shift = (0.0, 0.0)
    if band is not None:
        if reference is None or reference.grey.shape != (h, w):
            raise ValueError("a band of a key frame is sent over the cloud's copy of it")
        shifted = _shifted(reference.grey, shift, (sw, sh))
    elif reference is not None and config.reuse_max_diff > 0 and reference.grey.shape == (h, w):
        found = global_shift(grey, reference.grey)
        if found is not None:
            shift = found
            shifted = _shifted(reference.grey, shift, (sw, sh))
    if (sw, sh) != (w, h):
        grey = cv2.resize(grey, (sw, sh), interpolation=cv2.INTER_AREA)
        sx, sy = sw / w, sh / h
        text_boxes = [
            (int(x0 * sx), int(y0 * sy), math.ceil(x1 * sx), math.ceil(y1 * sy))
            for x0, y0, x1, y1 in text_boxes
        ]
        cx0, cy0, cx1, cy1 = frame.changed_bbox
        changed: BBox = (int(cx0 * sx), int(cy0 * sy), math.ceil(cx1 * sx), math.ceil(cy1 * sy))
    else:
        changed = frame.changed_bbox
    rows, cols = math.ceil(sh / p), math.ceil(sw / p)
    pad = round(config.text_pad_px * scale)
    score = importance((sw, sh), text_boxes, changed, p, pad)
    flat = score.ravel()
    candidates = int(np.count_nonzero(flat))
    k = min(candidates, math.ceil(keep_ratio * flat.size))
    keep = np.zeros(flat.size, dtype=bool)
    if k:
        keep[np.argsort(-flat, kind="stable")[:k]] = True
    background = int(np.median(grey[:: max(1, sh // 64), :: max(1, sw // 64)]))
    padded = np.full((rows * p, cols * p), background, dtype=np.uint8)
    padded[:sh, :sw] = grey
    tiles = padded.reshape(rows, p, cols, p).transpose(0, 2, 1, 3).reshape(rows * cols, p, p)
    complete = k == candidates and scale_factor >= 1.0 and noisy_levels is None
    reuse = np.zeros(flat.size, dtype=bool)
    band_rows: tuple[int, int] | None = None
    if band is not None:
        # The rows of patches whose text (counted before them) falls in the band; the rest
        # is the cloud's copy.
        per_row = keep.reshape(rows, cols).sum(axis=1)
        before = (np.cumsum(per_row) - per_row) / max(1, int(per_row.sum()))
        inside = np.flatnonzero((before >= band[0]) & ((before < band[1]) | (band[1] >= 1.0)))
        band_rows = (int(inside[0]), int(inside[-1]) + 1) if inside.size else (0, 0)
        in_band = np.zeros((rows, cols), dtype=bool)
        in_band[band_rows[0] : band_rows[1]] = True
        reuse = keep & ~in_band.ravel()
        keep &= in_band.ravel()
        k = int(keep.sum())
    elif shifted is not None and k:
        ref_pad = np.full((rows * p, cols * p), background, dtype=np.uint8)
        ref_pad[:sh, :sw] = shifted
        ref_tiles = ref_pad.reshape(rows, p, cols, p).transpose(0, 2, 1, 3).reshape(-1, p, p)
        cells = np.flatnonzero(keep)
        same = _matches(tiles[cells], ref_tiles[cells], config.reuse_max_diff)
        reuse[cells[same]] = True
        keep &= ~reuse
        k = int(keep.sum())
    kept = tiles[keep]
    lo = kept.min(axis=(1, 2)) if k else np.zeros(0, dtype=np.uint8)
    hi = kept.max(axis=(1, 2)) if k else np.zeros(0, dtype=np.uint8)
    if noisy and k and config.noisy_flat_span > 0:
        # Paper only (no ink): one grey (index 0 everywhere, lo = hi), nothing for LZMA to
        # code. Quantized to levels, a camera's noise on paper is random indices.
        flat_cell = (hi.astype(np.int16) - lo) < config.noisy_flat_span
        mid = kept.reshape(k, -1).mean(axis=1).round().astype(np.uint8)
        lo = np.where(flat_cell, mid, lo).astype(np.uint8)
        hi = np.where(flat_cell, mid, hi).astype(np.uint8)
        kept = np.where(flat_cell[:, None, None], mid[:, None, None], kept)
    levels = config.grey_levels
    if fine:
        levels = config.noisy_grey_levels if noisy_levels is None else noisy_levels
    codec = config.patch_codec
    if codec == "packed" and levels > 16:
        codec = "png"  # nothing to pack: 8-bit pixels
    index = np.zeros((0, p, p), dtype=np.uint8)
    if levels < 256 and k:
        # Per patch: `levels` steps from its darkest to its brightest pixel.
        span = np.maximum(hi - lo, 1).astype(np.float32)[:, None, None]
        steps = levels - 1
        index = np.rint((kept.astype(np.float32) - lo[:, None, None]) / span * steps).astype(
            np.uint8
        )
        # Spread over 0..255 for an image codec (it sees only `levels` distinct values).
        kept = (index.astype(np.float32) * (255 / steps)).round().astype(np.uint8)
    atlas = b""
    if k and codec == "packed":
        atlas = _pack(_atlas(index, p, 0), _bits(levels))
    elif k:
        image = _atlas(kept, p, background)
        if codec == "png" and levels <= 16:
            atlas = _palette_png(image, levels)
        else:
            if codec == "jpeg":
                params = [cv2.IMWRITE_JPEG_QUALITY, config.jpeg_quality]
                ok, buf = cv2.imencode(".jpg", image, params)
            else:
                ok, buf = cv2.imencode(".png", image, [cv2.IMWRITE_PNG_COMPRESSION, 9])
            if not ok:
                raise WireError("cannot code the patch atlas")
            atlas = buf.tobytes()
    meta = frame_meta(frame, w=w, h=h, sw=sw, sh=sh, bg=background)
    meta.update(levels=levels, codec=codec)
    if reuse.any():
        assert reference is not None
        meta["ref"] = reference.index
        meta["shift"] = [round(shift[0], 2), round(shift[1], 2)]
        if band_rows is not None:
            meta["band"] = list(band_rows)
    meta_b = json.dumps(meta, separators=(",", ":")).encode()
    mask = rle_encode(keep)
    reused = rle_encode(reuse) if reuse.any() else b""
    body = b"".join(
        [
            struct.pack("!I", len(meta_b)),
            meta_b,
            struct.pack("!I", len(mask)),
            mask,
            struct.pack("!I", len(reused)),
            reused,
            lo.astype(np.uint8).tobytes(),
            hi.astype(np.uint8).tobytes(),
            atlas,
        ]
    )
    payload = lzma.compress(body, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    return PatchMessage(
        payload,
        (rows, cols, p),
        k / flat.size,
        k,
        candidates,
        scale,
        int(reuse.sum()),
        levels,
        complete,
    )


def _atlas(tiles: np.ndarray, p: int, fill: int) -> np.ndarray:
    """`tiles` (k, p, p) laid out `ATLAS_COLS` per row in order: a text line's patches side by
    side, so its rows of pixels continue from patch to patch."""
    k = len(tiles)
    a_rows, a_cols = math.ceil(k / ATLAS_COLS), min(k, ATLAS_COLS)
    sheet = np.full((a_rows * a_cols, p, p), fill, dtype=np.uint8)
    sheet[:k] = tiles
    return sheet.reshape(a_rows, a_cols, p, p).transpose(0, 2, 1, 3).reshape(a_rows * p, -1)


def _tiles(atlas: np.ndarray, k: int, p: int) -> np.ndarray:
    a_rows, a_cols = math.ceil(k / ATLAS_COLS), min(k, ATLAS_COLS)
    if atlas.shape != (a_rows * p, a_cols * p):
        raise WireError("patch atlas does not decode to the announced patches")
    return atlas.reshape(a_rows, p, a_cols, p).transpose(0, 2, 1, 3).reshape(-1, p, p)[:k]


#: Largest difference from the frame's median grey that a patch's paper level may show.
_PAPER_RANGE = 64


def _fill_paper(canvas: np.ndarray, filled: np.ndarray, bg: int, rows: int, cols: int) -> None:
    """Fill the cells not sent (`canvas` holds `bg` there) with the paper grey of the patches
    around them: under a camera's uneven lighting one grey for all would leave straight steps
    along the patch grid, which the OCR's layout takes for the rules of a table. A patch's
    paper is whichever end of its range lies nearer the frame's median; cells with no patch
    near keep the median."""
    if not filled.any() or filled.all():
        return
    tiles = canvas[filled]
    dark = tiles.min(axis=(1, 2)).astype(np.float32)
    light = tiles.max(axis=(1, 2)).astype(np.float32)
    paper = np.where(np.abs(light - bg) <= np.abs(dark - bg), light, dark)
    # A patch all ink (no paper in it) says nothing about the paper: only levels within what
    # lighting does to a page (a vignette's corners ~25% darker) count.
    trusted = np.abs(paper - bg) <= _PAPER_RANGE
    level = np.zeros(rows * cols, dtype=np.float32)
    weight = np.zeros(rows * cols, dtype=np.float32)
    level[filled], weight[filled] = np.where(trusted, paper, 0.0), trusted
    # Normalized convolution: the weighted mean of the paper levels within a few cells.
    blur = cv2.GaussianBlur(level.reshape(rows, cols), (0, 0), 2.0).ravel()
    near = cv2.GaussianBlur(weight.reshape(rows, cols), (0, 0), 2.0).ravel()
    fill = np.where(near > 0.05, blur / np.maximum(near, 1e-6), float(bg))
    empty = ~filled
    canvas[empty] = np.clip(np.rint(fill[empty]), 0, 255).astype(np.uint8)[:, None, None]


def decode_patches(
    payload: bytes,
    shape: tuple[int, ...],
    *,
    stream_id: str,
    arrival_wall: float,
    references: Mapping[int, np.ndarray] | None = None,
) -> KeyFrame:
    """The key frame rebuilt from a VIDEO_PATCHES message (raises `WireError` if malformed,
    or if it copies patches from a key frame not in `references`: index -> rebuilt grey)."""
    if len(shape) != 3:
        raise WireError(f"patch message shape {shape} (expected rows, cols, patch px)")
    rows, cols, p = shape
    if not (0 < p <= 64 and 0 < rows * p <= 8192 and 0 < cols * p <= 8192):
        raise WireError(f"patch grid {rows}x{cols} of {p} px is out of range")
    try:
        inflater = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
        body = inflater.decompress(payload, _MAX_BODY)
        if not inflater.eof and not inflater.needs_input:
            raise WireError(f"patch message inflates past {_MAX_BODY} bytes")
        (n_meta,) = struct.unpack_from("!I", body)
        meta: dict[str, Any] = json.loads(body[4 : 4 + n_meta])
        (n_mask,) = struct.unpack_from("!I", body, 4 + n_meta)
        start = 8 + n_meta
        keep = rle_decode(body[start : start + n_mask], rows * cols)
        k = int(keep.sum())
        start += n_mask
        (n_reuse,) = struct.unpack_from("!I", body, start)
        start += 4
        reuse = (
            rle_decode(body[start : start + n_reuse], rows * cols)
            if n_reuse
            else np.zeros(rows * cols, dtype=bool)
        )
        start += n_reuse
        ref_index = None if meta.get("ref") is None else int(meta["ref"])
        shift = None
        if ref_index is not None:
            shift = (float(meta["shift"][0]), float(meta["shift"][1]))
        band = None if meta.get("band") is None else (int(meta["band"][0]), int(meta["band"][1]))
        lo = np.frombuffer(body[start : start + k], dtype=np.uint8)
        hi = np.frombuffer(body[start + k : start + 2 * k], dtype=np.uint8)
        if len(hi) != k:
            raise WireError("patch message: grey ranges do not match the mask")
        atlas_b = body[start + 2 * k :]
        w, h, bg = int(meta["w"]), int(meta["h"]), int(meta["bg"])
        sw, sh = int(meta.get("sw", w)), int(meta.get("sh", h))
        levels = int(meta.get("levels", 256))
        codec = str(meta.get("codec", "png"))
    except (struct.error, ValueError, KeyError, TypeError, lzma.LZMAError, EOFError) as e:
        raise WireError(f"malformed patch message: {e}") from e
    if not (0 < sw <= cols * p and 0 < sh <= rows * p and 0 <= bg <= 255):
        raise WireError(f"patch message of {sw}x{sh} does not fit its {rows}x{cols} grid")
    if not (sw <= w <= 8 * sw and sh <= h <= 8 * sh and w * h <= 4096 * 4096):
        raise WireError(f"patch message scales {sw}x{sh} to {w}x{h}: out of range")
    if not 2 <= levels <= 256:
        raise WireError(f"patch message with {levels} grey levels")
    if (keep & reuse).any() or (reuse.any() and ref_index is None):
        raise WireError("patch message: sent and reused patches overlap, or no reference")
    if band is not None and not 0 <= band[0] <= band[1] <= rows:
        raise WireError(f"patch message band {band} outside its {rows} rows")
    canvas = np.full((rows * cols, p, p), bg, dtype=np.uint8)
    held: np.ndarray | None = None
    if reuse.any():
        held = None if references is None or ref_index is None else references.get(ref_index)
        if held is None or held.shape != (h, w):
            raise WireError(f"patch message copies from key frame {ref_index}, not held here")
        assert shift is not None
        ref_pad = np.full((rows * p, cols * p), bg, dtype=np.uint8)
        ref_pad[:sh, :sw] = _shifted(held, shift, (sw, sh))
        ref_tiles = ref_pad.reshape(rows, p, cols, p).transpose(0, 2, 1, 3).reshape(-1, p, p)
        canvas[reuse] = ref_tiles[reuse]
    if k:
        if codec == "packed":
            if levels > 16:
                raise WireError("packed patches need <= 16 grey levels")
            a_rows, a_cols = math.ceil(k / ATLAS_COLS), min(k, ATLAS_COLS)
            n = a_rows * p * a_cols * p
            index = _unpack(atlas_b, _bits(levels), n).reshape(a_rows * p, a_cols * p)
            if int(index.max()) >= levels:
                raise WireError("patch atlas holds values beyond its grey levels")
            tiles = _tiles(index, k, p).astype(np.float32) * (255 / (levels - 1))
        else:
            atlas = cv2.imdecode(np.frombuffer(atlas_b, dtype=np.uint8), cv2.IMREAD_GRAYSCALE)
            if atlas is None:
                raise WireError("patch atlas does not decode")
            tiles = _tiles(atlas, k, p).astype(np.float32)
        if levels < 256:
            lo_f = lo.astype(np.float32)[:, None, None]
            span = np.maximum(hi.astype(np.float32) - lo, 1)[:, None, None]
            tiles = np.clip(np.rint(lo_f + tiles / 255 * span), 0, 255)
        canvas[keep] = tiles.astype(np.uint8)
    _fill_paper(canvas, keep | reuse, bg, rows, cols)
    sheet = canvas.reshape(rows, cols, p, p).transpose(0, 2, 1, 3).reshape(rows * p, cols * p)
    grey: np.ndarray = sheet[:sh, :sw]
    if (sw, sh) != (w, h):
        # Cubic: smooth strokes for the recognizer, not the blocks of a nearest-neighbour zoom.
        grey = cv2.resize(grey, (w, h), interpolation=cv2.INTER_CUBIC)
    if band is not None and reuse.any():
        # A part of a refinement: outside its rows, the held copy pixel for pixel.
        assert held is not None
        y0, y1 = (min(h, round(r * p * h / sh)) for r in band)
        whole = held.copy()
        whole[y0:y1] = grey[y0:y1]
        grey = whole
    return key_frame(meta, grey, stream_id=stream_id, arrival_wall=arrival_wall, what="patch")


def frame_meta(frame: KeyFrame, **coding: Any) -> dict[str, Any]:
    """A coded key frame's JSON header: its time and index, the coding's own fields (in the
    order given), then the key frame's change fields, which `key_frame` reads back."""
    return {
        "t": frame.t_media,
        "index": frame.index,
        **coding,
        "changed_bbox": list(frame.changed_bbox),
        "changed_frac": frame.changed_frac,
        "content_bbox": None if frame.content_bbox is None else list(frame.content_bbox),
        "t_changed": frame.t_changed,
        "reason": frame.reason,
    }


def key_frame(
    meta: Mapping[str, Any], grey: np.ndarray, *, stream_id: str, arrival_wall: float, what: str
) -> KeyFrame:
    """The key frame a `frame_meta` header and its rebuilt grey picture describe (raises
    `WireError` naming the `what` message when the header's fields are malformed)."""
    rgb = np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))
    content = meta.get("content_bbox")
    try:
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
    except (ValueError, KeyError, TypeError) as e:
        raise WireError(f"malformed {what} message: {e}") from e


class TextBoxes:
    """The edge's text detector: rapidocr's PP-OCR detector alone (no recognizer), boxes in
    frame pixels. Loaded on first use; blocking (call it from a worker thread)."""

    def __init__(self, det_max_side_px: int = 960, threads: int = 1) -> None:
        self.det_max_side_px = det_max_side_px
        self.threads = threads
        self._det: Any = None
        self._engine: Any = None

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
        self._engine = engine

    def recognizer(self) -> Any:
        """rapidocr's text recognizer of this detector's engine (same settings: threads),
        loaded on first use: what `transport.textlines.TextReader` runs on the boxes found."""
        self.load()
        rec = self._engine._load_rec_model()  # rapidocr loads it lazily, on the first text
        if rec is None:
            from streamfuse.errors import ModelError

            raise ModelError("rapidocr did not load its text recognizer")
        return rec

    def __call__(self, image: np.ndarray) -> list[BBox]:
        return [box for box, _quad in self.regions(image)]

    def regions(self, image: np.ndarray) -> list[tuple[BBox, np.ndarray]]:
        """Each text region found: its box in frame pixels and the detector's quadrilateral
        (4 x 2 float32, clockwise from top left): a filmed page's lines are tilted, and the
        recognizer reads the quadrilateral straightened, not the box."""
        self.load()
        h, w = image.shape[:2]
        out = self._det(np.ascontiguousarray(image[..., ::-1]))
        found: list[tuple[BBox, np.ndarray]] = []
        for quad in [] if out.boxes is None else out.boxes:
            q = np.asarray(quad, dtype=np.float64).reshape(-1, 2)
            x0, y0 = max(0, math.floor(q[:, 0].min())), max(0, math.floor(q[:, 1].min()))
            x1, y1 = min(w, math.ceil(q[:, 0].max())), min(h, math.ceil(q[:, 1].max()))
            if x1 > x0 and y1 > y0:
                found.append(((x0, y0, x1, y1), q.astype(np.float32)))
        return found


__all__ = [
    "REFERENCES_HELD",
    "PatchMessage",
    "Reference",
    "TextBoxes",
    "global_shift",
    "decode_patches",
    "encode_patches",
    "frame_meta",
    "importance",
    "key_frame",
    "text_scale",
]
