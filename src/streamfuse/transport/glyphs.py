"""Symbol (glyph-dictionary) coding of a key frame's text, the way JBIG2's text regions code a
page: the 2-level text picture the patch coding would send is cut into connected components,
components that match an earlier one pixel for pixel within a strict tolerance are sent as a
reference to it, and the rest as new shapes; positions, references and shapes go through one
adaptive binary range coder (shapes with a JBIG-like 10-pixel context).

`encode_glyphs(frame, text_boxes, config, text_px) -> GlyphMessage` and
`decode_glyphs(payload, stream_id=..., arrival_wall=...) -> KeyFrame` (raises `WireError` on a
malformed payload, whatever the bytes). The match rule (`MatchRule`) is what keeps a 6 from
standing in for an 8: a shape stands in for a component only when each one's ink lies within
one pixel of the other's (a Hausdorff distance of 1) and few pixels differ.
"""

from __future__ import annotations

import functools
import json
import lzma
import math
import struct
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from scipy import ndimage

from streamfuse.transport.config import TransportConfig
from streamfuse.transport.patches import (
    frame_meta,
    importance,
    key_frame,
    noise_sigma,
    text_scale,
)
from streamfuse.transport.wire import WireError
from streamfuse.vision.frames import BBox, KeyFrame

MAGIC = b"GL1"
#: Shapes larger than this (either side, px; or area) are no glyphs (rules, pictures, inverted
#: blocks): they go as a packed bitmap beside the symbols.
MAX_GLYPH_SIDE_PX = 96
MAX_GLYPH_AREA_PX = 4096
#: Bounds a decoder holds any payload to (a hostile one must not make it loop for minutes).
MAX_GLYPHS = 200_000
MAX_SHAPES = 50_000
MAX_SIDE_PX = 8192


@dataclass(frozen=True, slots=True)
class MatchRule:
    """When a dictionary shape may stand in for a component (same box size +-`size_px`):
    after aligning their boxes, every ink pixel of each lies within `hausdorff_px` (0 or 1) of
    the other's ink, and the pixels that differ are at most `max_xor` of the component's ink
    (and never `max_thick` or more of them in any 2x2 block: a thick difference is a stroke
    one of them lacks)."""

    size_px: int = 1
    hausdorff_px: int = 1
    #: 0.2 let a 't' stand for an 'l' (and 'i'/'l') on a filmed page: within a pixel of each
    #: other, the crossbar a few pixels (docs/edge-cloud.md, "Glyph-dictionary coding").
    max_xor: float = 0.1
    max_thick: int = 3


@dataclass(frozen=True, slots=True)
class GlyphMessage:
    payload: bytes
    scale: float
    glyphs: int
    shapes: int
    #: Components too large for a glyph, sent as a packed bitmap.
    residual_px: int


# -- an adaptive binary range coder (LZMA's: 11-bit probabilities) ----------------------------
#
# All decisions share one table of probabilities, each family at its own offset. The encoder
# first lists every decision (context, bit), then codes the list in one loop over Python ints
# held in locals, not a method call per bit; the decoder's hot loops do the same.

_TOP = 1 << 24
_PROB_BITS = 11
_PROB_ONE = 1 << _PROB_BITS
_MOVE = 4

#: Integer families: first glyph of a line dx, dy; later glyphs dx, dy; counts; shape h, w.
_INT_FAMILIES = 8
_INT_CTX = 64
_INDEX_BITS = 16
#: Where each family's probabilities start in the shared table (a shape pixel's context is
#: its index).
_PIXELS = 0
_INTS = _PIXELS + 1024
_NEW = _INTS + _INT_FAMILIES * _INT_CTX
_INDEX = _NEW + 4
_N_PROBS = _INDEX + (1 << (_INDEX_BITS + 1))


class _Encoder:
    """The decisions to code, in order; `finish` range-codes them."""

    def __init__(self) -> None:
        self.ctxs: list[int] = []
        self.bits: list[int] = []
        #: New shapes, each with where its pixels go among the decisions: their contexts are
        #: computed for all shapes at once when the list is complete.
        self.shapes: list[tuple[int, np.ndarray]] = []

    def finish(self) -> bytes:
        ctxs, bits = self.ctxs, self.bits
        if self.shapes:
            pixels = _bitmap_decisions([b for _, b in self.shapes])
            ctxs, bits, last = [], [], 0
            for (at, _), (c, b) in zip(self.shapes, pixels, strict=True):
                ctxs += self.ctxs[last:at]
                bits += self.bits[last:at]
                ctxs += c
                bits += b
                last = at
            ctxs += self.ctxs[last:]
            bits += self.bits[last:]
        return _range_code(ctxs, bits)


def _range_code(ctxs: list[int], bits: list[int]) -> bytes:
    # The constants are spelled out in the loops (11: _PROB_BITS, 4: _MOVE, 2048: _PROB_ONE,
    # 0x1000000: _TOP): no global's lookup per bit.
    probs = [_PROB_ONE // 2] * _N_PROBS
    low, rng, cache, cache_size = 0, 0xFFFFFFFF, 0, 1
    out = bytearray()
    for c, b in zip(ctxs, bits, strict=True):
        p = probs[c]
        bound = (rng >> 11) * p
        if b:
            low += bound
            rng -= bound
            probs[c] = p - (p >> 4)
        else:
            rng = bound
            probs[c] = p + ((2048 - p) >> 4)
        while rng < 0x1000000:
            rng <<= 8
            if low < 0xFF000000 or low >= 1 << 32:
                carry = low >> 32
                out.append((cache + carry) & 0xFF)
                if cache_size > 1:
                    out += bytes([(0xFF + carry) & 0xFF]) * (cache_size - 1)
                cache_size = 0
                cache = (low >> 24) & 0xFF
            cache_size += 1
            low = (low & 0x00FFFFFF) << 8
    for _ in range(5):
        if low < 0xFF000000 or low >= 1 << 32:
            carry = low >> 32
            out.append((cache + carry) & 0xFF)
            if cache_size > 1:
                out += bytes([(0xFF + carry) & 0xFF]) * (cache_size - 1)
            cache_size = 0
            cache = (low >> 24) & 0xFF
        cache_size += 1
        low = (low & 0x00FFFFFF) << 8
    return bytes(out)


class _Decoder:
    """Decisions back from the range-coded bytes, with the encoder's probabilities."""

    __slots__ = ("code", "data", "pos", "probs", "range")

    def __init__(self, data: bytes) -> None:
        if len(data) < 5:
            raise WireError("glyph message: range-coded stream too short")
        self.data = data
        self.pos = 5
        self.range = 0xFFFFFFFF
        self.code = int.from_bytes(data[1:5], "big")
        self.probs = [_PROB_ONE // 2] * _N_PROBS

    def bit(self, ctx: int) -> int:
        probs = self.probs
        p = probs[ctx]
        bound = (self.range >> 11) * p
        if self.code < bound:
            self.range = bound
            probs[ctx] = p + ((2048 - p) >> 4)
            bit = 0
        else:
            self.code -= bound
            self.range -= bound
            probs[ctx] = p - (p >> 4)
            bit = 1
        while self.range < 0x1000000:
            self.range <<= 8
            if self.pos >= len(self.data):
                raise WireError("glyph message: range-coded stream ends early")
            self.code = ((self.code << 8) | self.data[self.pos]) & 0xFFFFFFFF
            self.pos += 1
        return bit


_DX_FIRST, _DY_FIRST, _DX, _DY, _COUNT, _H, _W, _DH = range(8)


def _put_int(enc: _Encoder, family: int, value: int) -> None:
    ctxs, bits = _int_decisions(family, value)
    enc.ctxs += ctxs
    enc.bits += bits


@functools.lru_cache(maxsize=8192)
def _int_decisions(family: int, value: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Exp-Golomb-like: zero flag, sign, bit length in unary, then the bits below the top
    (the contexts and bits; the same few values recur, so they are kept)."""
    base = _INTS + family * _INT_CTX
    if not value:
        return (base,), (0,)
    mag = abs(value)
    n = mag.bit_length()
    ctxs = [base, base + 1]
    ctxs += [base + 2 + min(i, 20) for i in range(1, n + 1)]
    ctxs += [base + 24 + min(n, 10) * 3 + min(i, 2) for i in range(n - 2, -1, -1)]
    bits = [1, 1 if value < 0 else 0] + [1] * (n - 1) + [0]
    bits += [(mag >> i) & 1 for i in range(n - 2, -1, -1)]
    return tuple(ctxs), tuple(bits)


def _get_int(dec: _Decoder, family: int) -> int:
    base = _INTS + family * _INT_CTX
    if not dec.bit(base):
        return 0
    negative = dec.bit(base + 1)
    n = 1
    while dec.bit(base + 2 + min(n, 20)):
        n += 1
        if n > 30:
            raise WireError("glyph message: integer too long")
    mag = 1
    for i in range(n - 2, -1, -1):
        mag = (mag << 1) | dec.bit(base + 24 + min(n, 10) * 3 + min(i, 2))
    return -mag if negative else mag


def _put_index(enc: _Encoder, index: int) -> None:
    """A dictionary index as 16 binary decisions down a tree (each node its own probability:
    an adaptive frequency model of the shapes)."""
    top, index = _INDEX_BITS, index & ((1 << _INDEX_BITS) - 1)
    enc.ctxs.extend([_INDEX + ((1 << k) | (index >> (top - k))) for k in range(top)])
    enc.bits.extend([(index >> (top - 1 - k)) & 1 for k in range(top)])


def _get_index(dec: _Decoder) -> int:
    """`_put_index`'s 16 decisions, decoded in one loop over locals."""
    data, n_data, probs = dec.data, len(dec.data), dec.probs
    rng, code, pos = dec.range, dec.code, dec.pos
    node = 1
    for _ in range(_INDEX_BITS):
        ctx = _INDEX + node
        p = probs[ctx]
        bound = (rng >> 11) * p
        if code < bound:
            rng = bound
            probs[ctx] = p + ((2048 - p) >> 4)
            node <<= 1
        else:
            code -= bound
            rng -= bound
            probs[ctx] = p - (p >> 4)
            node = (node << 1) | 1
        while rng < 0x1000000:
            rng <<= 8
            if pos >= n_data:
                raise WireError("glyph message: range-coded stream ends early")
            code = ((code << 8) | data[pos]) & 0xFFFFFFFF
            pos += 1
    dec.range, dec.code, dec.pos = rng, code, pos
    return node - (1 << _INDEX_BITS)


# The 10-pixel template (dy, dx) of each context bit: two rows above and the row so far.
_TEMPLATE = (
    (-2, -1),
    (-2, 0),
    (-2, 1),
    (-1, -2),
    (-1, -1),
    (-1, 0),
    (-1, 1),
    (-1, 2),
    (0, -2),
    (0, -1),
)
#: The context of the next pixel keeps these bits of the last one's, shifted down one.
_KEEP = 0b01_01111_011


def _bitmap_decisions(bitmaps: list[np.ndarray]) -> list[tuple[list[int], list[int]]]:
    """The (contexts, bits) of each shape's pixels, row by row, each shape on its own (zeros
    around it): shapes of one width stacked two empty rows apart, one pass per width."""
    out: list[tuple[list[int], list[int]]] = [([], [])] * len(bitmaps)
    by_width: dict[int, list[int]] = {}
    for k, bitmap in enumerate(bitmaps):
        by_width.setdefault(int(bitmap.shape[1]), []).append(k)
    for w, ks in by_width.items():
        heights = [int(bitmaps[k].shape[0]) for k in ks]
        rows = sum(heights) + 2 * len(ks)
        pad = np.zeros((rows, w + 4), dtype=np.int32)
        real = np.zeros(rows - 2, dtype=bool)  # rows of pixels (pad's row less 2)
        y = 0
        for k, h in zip(ks, heights, strict=True):
            y += 2
            pad[y : y + h, 2 : 2 + w] = bitmaps[k]
            real[y - 2 : y - 2 + h] = True
            y += h
        ctx = np.zeros((rows - 2, w), dtype=np.int32)
        for i, (dy, dx) in enumerate(_TEMPLATE):
            ctx |= pad[2 + dy : rows + dy, 2 + dx : 2 + dx + w] << i
        ctxs = ctx[real].ravel().tolist()  # _PIXELS is 0
        bits = pad[2:, 2 : 2 + w][real].ravel().tolist()
        start = 0
        for k, h in zip(ks, heights, strict=True):
            out[k] = (ctxs[start : start + h * w], bits[start : start + h * w])
            start += h * w
    return out


def _get_bitmap(dec: _Decoder, h: int, w: int) -> np.ndarray:
    """The pixels of an h x w shape, row by row: each context from the last one's (the
    template slid one pixel right) and the three pixels that enter it."""
    data, n_data, probs = dec.data, len(dec.data), dec.probs
    rng, code, pos = dec.range, dec.code, dec.pos
    zeros = [0] * (w + 5)
    above2, above, out = zeros, zeros, []
    for _ in range(h):
        # What enters the context on the step from pixel x to x+1: a[x+2] (bit 2) and b[x+3]
        # (bit 7), a and b the rows two and one above, padded 2 left and 3 right (a[x] is
        # above2[x + 2]); the pixel just decoded enters as bit 9.
        enter = [(a << 2) | (b << 7) for a, b in zip(above2[4:], above[5:], strict=False)]
        # The first pixel's context: a[-1..1], b[-2..2] (c[-2], c[-1] are 0).
        ctx = (
            above2[1]
            | above2[2] << 1
            | above2[3] << 2
            | above[0] << 3
            | above[1] << 4
            | above[2] << 5
            | above[3] << 6
            | above[4] << 7
        )
        row = [0, 0]
        for e in enter:
            p = probs[ctx]  # _PIXELS is 0
            bound = (rng >> 11) * p
            if code < bound:
                rng = bound
                probs[ctx] = p + ((2048 - p) >> 4)
                bit = 0
            else:
                code -= bound
                rng -= bound
                probs[ctx] = p - (p >> 4)
                bit = 1
            while rng < 0x1000000:
                rng <<= 8
                if pos >= n_data:
                    raise WireError("glyph message: range-coded stream ends early")
                code = ((code << 8) | data[pos]) & 0xFFFFFFFF
                pos += 1
            row.append(bit)
            ctx = ((ctx >> 1) & 0b01_01111_011) | e | (bit << 9)  # _KEEP
        row += [0, 0, 0]
        out.append(row)
        above2, above = above, row
    dec.range, dec.code, dec.pos = rng, code, pos
    return np.array([r[2 : 2 + w] for r in out], dtype=bool).reshape(h, w)


# -- the text picture and its components -------------------------------------------------------


def text_bitmap(
    frame: KeyFrame, text_boxes: list[BBox], config: TransportConfig, text_px: int
) -> tuple[np.ndarray, float, int, int, list[BBox]]:
    """The ink of the frame's text patches as the 2-level patch coding cuts it (scaled so the
    smallest line is `text_px` tall; each text patch split at the middle of its own grey range;
    a patch of paper alone, range under `noisy_flat_span`, no ink; the ink the smaller side of
    the cut around each patch, dark or light): (ink, scale, paper grey, ink grey, text boxes
    scaled)."""
    p = config.patch_px
    w, h = frame.size
    grey = cv2.cvtColor(frame.image, cv2.COLOR_RGB2GRAY)
    noisy = noise_sigma(grey) >= config.denoise_min_sigma
    scaled = config.model_copy(update={"text_px": text_px, "noisy_text_px": text_px})
    scale = text_scale(text_boxes, scaled, noisy=noisy)
    sw, sh = max(1, round(w * scale)), max(1, round(h * scale))
    if config.denoise_px > 1 and noisy:
        k_px = config.denoise_px | 1
        grey = cv2.GaussianBlur(grey, (k_px, k_px), 0)
    if (sw, sh) != (w, h):
        grey = cv2.resize(grey, (sw, sh), interpolation=cv2.INTER_AREA)
        sx, sy = sw / w, sh / h
        text_boxes = [
            (int(x0 * sx), int(y0 * sy), math.ceil(x1 * sx), math.ceil(y1 * sy))
            for x0, y0, x1, y1 in text_boxes
        ]
    rows, cols = math.ceil(sh / p), math.ceil(sw / p)
    score = importance((sw, sh), text_boxes, (0, 0, 0, 0), p, round(config.text_pad_px * scale))
    background = int(np.median(grey[:: max(1, sh // 64), :: max(1, sw // 64)]))
    padded = np.full((rows * p, cols * p), background, dtype=np.uint8)
    padded[:sh, :sw] = grey
    tiles = padded.reshape(rows, p, cols, p).transpose(0, 2, 1, 3).reshape(rows * cols, p, p)
    lo = tiles.min(axis=(1, 2)).astype(np.int16)[:, None, None]
    hi = tiles.max(axis=(1, 2)).astype(np.int16)[:, None, None]
    # The patch coding's 2 levels: index 0 (its darkest grey) where rint((v - lo) / span) is 0.
    dark = (tiles.astype(np.int16) - lo) * 2 <= (hi - lo)
    text = (score.ravel() > 0) & ((hi - lo).ravel() >= max(1, config.noisy_flat_span))
    # Which side is the ink: the smaller one around each patch (light text on a dark slide
    # has more dark than light pixels); over 5x5 patches, as one patch may lie inside a stroke.
    weight = text.reshape(rows, cols).astype(np.float32)
    dark_share = dark.mean(axis=(1, 2)).reshape(rows, cols).astype(np.float32) * weight
    near = cv2.blur(weight, (5, 5), borderType=cv2.BORDER_CONSTANT)
    light_text = cv2.blur(dark_share, (5, 5), borderType=cv2.BORDER_CONSTANT) > 0.5 * near
    ink_tiles = np.where(light_text.ravel()[:, None, None], ~dark, dark) & text[:, None, None]
    sheet = (rows, cols, p, p)
    ink = ink_tiles.reshape(sheet).transpose(0, 2, 1, 3).reshape(rows * p, cols * p)[:sh, :sw]
    in_text = np.repeat(np.repeat(text.reshape(rows, cols), p, axis=0), p, axis=1)[:sh, :sw]
    ink_grey = int(np.median(grey[ink])) if ink.any() else 0
    paper_px = grey[in_text & ~ink]
    paper = int(np.median(paper_px)) if paper_px.size else background
    return np.ascontiguousarray(ink), scale, paper, ink_grey, text_boxes


def _shift_rows(rows: np.ndarray, k: int) -> np.ndarray:
    """Rows of little-endian 64-bit words, each row's bits moved k places towards bit 0
    (k < 0: away from it); bits do not cross from one row to the next."""
    if not k:
        return rows
    if abs(k) >= 64:
        step = 63 if k > 0 else -63
        return _shift_rows(_shift_rows(rows, step), k - step)
    out = np.empty_like(rows)
    m = np.uint64(abs(k))
    back = np.uint64(64 - abs(k))
    if k > 0:
        out[..., :-1] = (rows[..., :-1] >> m) | (rows[..., 1:] << back)
        out[..., -1] = rows[..., -1] >> m
    else:
        out[..., 1:] = (rows[..., 1:] << m) | (rows[..., :-1] >> back)
        out[..., 0] = rows[..., 0] << m
    return out


class _Dictionary:
    """The shapes sent so far, and the match of each component, in coding order, against them.

    A shape is a component sent as new, so every component is held once, up front: as one
    Python int, bit `row * stride + col` (moved by (dy, dx) it is the int shifted by
    `dy * stride + dx`; a dilation is four shifts), and as rows of 64-bit words in one array.
    The pixels that differ between each component of a batch of `BATCH` and every shape it
    may match (those sent before the batch, and the batch's earlier components, in case they
    go as new shapes), in every box alignment, come out of a few numpy operations per batch;
    the match itself is then decided in order, among the few within the pixel budget."""

    BATCH = 64

    def __init__(self, rule: MatchRule, bitmaps: list[np.ndarray]) -> None:
        self.rule = rule
        s, r = rule.size_px, rule.hausdorff_px
        # Where a component's box starts (row and column): shapes may start s px before it,
        # and a dilation by r must not reach row or column 0.
        self.origin = o = s + 1 + r
        # Rows as long and as many as this page's largest component needs (a glyph of a
        # 34 px line is ~10 x 10 px: one 64-bit word a row, ~20 rows).
        high = max((int(b.shape[0]) for b in bitmaps), default=1)
        wide = max((int(b.shape[1]) for b in bitmaps), default=1)
        self.words = -(-(2 * o + wide + 2 * s + 2) // 64)
        self.stride = stride = 64 * self.words
        self.rows = o + high + 2 * s + 2
        self.bitmaps = bitmaps
        self.ints = [self._bits(b) for b in bitmaps]
        n = len(bitmaps)
        self.size = np.array(
            [
                (b.shape[0], b.shape[1], v.bit_count())
                for b, v in zip(bitmaps, self.ints, strict=True)
            ],
            dtype=np.int64,
        ).reshape(n, 3)
        at = o * stride + o
        self.packed = np.frombuffer(
            b"".join(self._words(v << at) for v in self.ints), dtype="<u8"
        ).reshape(n, self.rows, self.words)
        #: Dictionary index -> component, and component -> dictionary index (-1: none).
        self.shapes: list[int] = []
        self.shape_of = [-1] * n
        #: A component pixel for pixel like a shape (~1 in 6 on a filmed page) is found here.
        self.exact: dict[tuple[int, int, int], int] = {}
        #: Per component of the current batch: (pixels differing, order of the search,
        #: component it is compared with, dy, dx) of each comparison within the budget.
        self.near: dict[int, list[tuple[int, int, int, int, int]]] = {}

    def _bits(self, bitmap: np.ndarray) -> int:
        h, w = bitmap.shape
        rows = np.zeros((h, self.stride), dtype=bool)
        rows[:, :w] = bitmap
        return int.from_bytes(np.packbits(rows, bitorder="little").tobytes(), "little")

    def _words(self, bits: int) -> bytes:
        return bits.to_bytes(self.rows * self.stride // 8, "little")

    def add(self, c: int) -> int:
        """Component `c` sent as a new shape: its dictionary index."""
        index = len(self.shapes)
        self.shapes.append(c)
        self.shape_of[c] = index
        h, w = self.bitmaps[c].shape
        self.exact[(self.ints[c], h, w)] = index
        return index

    def _compare(self, start: int, stop: int) -> None:
        """`near` of components start..stop-1."""
        rule, s, o = self.rule, self.rule.size_px, self.origin
        side = 2 * s + 1
        glyphs = np.arange(start, stop)
        targets = np.concatenate([np.asarray(self.shapes, dtype=np.int64), glyphs])
        g_size, t_size = self.size[glyphs], self.size[targets]
        budget = rule.max_xor * g_size[:, 2]
        dh = g_size[:, None, 0] - t_size[None, :, 0]
        dw = g_size[:, None, 1] - t_size[None, :, 1]
        # Box size within s, at least the difference in ink differs (most go here), and a
        # component of the batch only for the later ones.
        ok = (np.abs(dh) <= s) & (np.abs(dw) <= s)
        ok &= np.abs(g_size[:, None, 2] - t_size[None, :, 2]) <= budget[:, None]
        ok[:, len(self.shapes) :] &= targets[None, len(self.shapes) :] < glyphs[:, None]
        gi, ti = np.nonzero(ok)
        self.near = {int(g): [] for g in glyphs}
        if not gi.size:
            return
        dh, dw = dh[gi, ti], dw[gi, ti]
        # Every (pair, alignment): oy 0 or dh, ox 0 or dw (each once when dh or dw is 0), in
        # the order the first implementation tried them.
        zero = np.zeros_like(dh)
        oy = np.concatenate([zero, zero, dh, dh])
        ox = np.concatenate([zero, dw, zero, dw])
        keep = np.concatenate([zero == 0, dw != 0, dh != 0, (dh != 0) & (dw != 0)])
        align = np.repeat(np.arange(4), gi.size)[keep]
        gi, ti, oy, ox = np.tile(gi, 4)[keep], np.tile(ti, 4)[keep], oy[keep], ox[keep]
        # Each component moved by (-oy, -ox) instead of each shape by (oy, ox): its rows
        # shifted, then its bits within each row (no ink lies within s of a row's ends).
        views = np.zeros((stop - start, side * side, self.rows, self.words), dtype=np.uint64)
        at = self.packed[start:stop]
        for ay in range(-s, s + 1):
            rows = np.zeros_like(at)
            if ay >= 0:
                rows[:, : self.rows - ay] = at[:, ay:]
            else:
                rows[:, -ay:] = at[:, : self.rows + ay]
            for ax in range(-s, s + 1):
                views[:, (ay + s) * side + ax + s] = _shift_rows(rows, ax)
        top = min(self.rows, o + int(g_size[:, 0].max()) + s + 1)
        xor = self.packed[targets[ti], :top] ^ views[gi, (oy + s) * side + ox + s, :top]
        differ = np.bitwise_count(xor).sum(axis=(1, 2), dtype=np.int64)
        hit = np.flatnonzero(differ <= budget[gi])
        gh, gw = g_size[gi[hit], 0], g_size[gi[hit], 1]
        th, tw = t_size[ti[hit], 0], t_size[ti[hit], 1]
        rank = ((th - (gh - s)) * side + tw - (gw - s)) * 4 + align[hit]
        for g, n, k, t, y, x in zip(
            (gi[hit] + start).tolist(),
            differ[hit].tolist(),
            rank.tolist(),
            targets[ti[hit]].tolist(),
            oy[hit].tolist(),
            ox[hit].tolist(),
            strict=True,
        ):
            self.near[g].append((n, k, t, y, x))

    def match(self, c: int) -> tuple[int, int, int] | None:
        """(shape, dy, dx): the closest shape that may stand in for component `c`, and where
        its box lies from the component's top left (0 or -1 when the sizes differ), or None.
        Ties go to the first shape met in the first implementation's search: box sizes (h,
        then w, ascending), alignments (top/left first), shapes in the order they came.
        Components are matched in order (start, start+1, ...)."""
        if c not in self.near:
            self._compare(c, min(c + self.BATCH, len(self.bitmaps)))
        near = self.near.pop(c)
        bits = self.ints[c]
        h, w = self.bitmaps[c].shape
        same = self.exact.get((bits, h, w))
        if same is not None:
            return same, 0, 0
        shape_of = self.shape_of
        found = sorted((n, k, shape_of[t], y, x) for n, k, t, y, x in near if shape_of[t] >= 0)
        o, stride = self.origin, self.stride
        canvas = bits << (o * stride + o)
        for _n, _k, i, ay, ax in found:
            placed = self.ints[self.shapes[i]] << ((o + ay) * stride + o + ax)
            if self._close(placed, canvas, placed ^ canvas):
                return i, ay, ax
        return None

    def _close(self, a: int, b: int, xor: int) -> bool:
        rule = self.rule
        stride = self.stride
        if rule.max_thick <= 4:
            # The 2x2 blocks, each at its top left pixel: how many of the 4 differ.
            p, q, u, v = xor, xor >> 1, xor >> stride, xor >> (stride + 1)
            t = rule.max_thick
            if t <= 0:
                return False
            if t == 1:
                thick = xor
            elif t == 2:
                thick = (p & q) | (u & v) | ((p | q) & (u | v))
            elif t == 3:
                thick = (p & q & (u | v)) | (u & v & (p | q))
            else:
                thick = p & q & u & v
            if thick:
                return False
        if rule.hausdorff_px == 0:
            return not xor
        da, db = a, b
        for _ in range(rule.hausdorff_px):
            da |= (da << 1) | (da >> 1)
            da |= (da << stride) | (da >> stride)
            db |= (db << 1) | (db >> 1)
            db |= (db << stride) | (db >> stride)
        return not ((a & ~db) or (b & ~da))


def _groups(boxes: list[tuple[int, int, int, int]], text_boxes: list[BBox]) -> list[list[int]]:
    """Components (x0, y0, x1, y1) in reading order: by the text line whose box holds each
    one's centre (nearest line centre when several), lines top to bottom, left to right in a
    line; components in no line last, by rows."""
    lines = sorted(range(len(text_boxes)), key=lambda i: (text_boxes[i][1], text_boxes[i][0]))
    found = [-1] * len(boxes)
    if boxes and lines:
        comp = np.asarray(boxes, dtype=np.float64)
        line = np.asarray([text_boxes[i] for i in lines], dtype=np.float64)
        cx = ((comp[:, 0] + comp[:, 2]) / 2)[:, None]
        cy = ((comp[:, 1] + comp[:, 3]) / 2)[:, None]
        inside = (line[:, 0] <= cx) & (cx <= line[:, 2]) & (line[:, 1] <= cy) & (cy <= line[:, 3])
        # The nearest line centre; the first line (by rank) of equally near ones.
        d = np.where(inside, np.abs(cy - (line[:, 1] + line[:, 3]) / 2), np.inf)
        found = np.where(inside.any(axis=1), d.argmin(axis=1), -1).tolist()
    groups: dict[int, list[int]] = {}
    for ci, rank in enumerate(found):
        groups.setdefault(rank, []).append(ci)
    out = [
        sorted(groups[g], key=lambda c: (boxes[c][0], boxes[c][3]))
        for g in sorted(groups)
        if g >= 0
    ]
    if -1 in groups:
        out.append(sorted(groups[-1], key=lambda c: (boxes[c][3] // 8, boxes[c][0])))
    return out


def encode_glyphs(
    frame: KeyFrame,
    text_boxes: list[BBox],
    config: TransportConfig,
    text_px: int = 26,
    rule: MatchRule | None = None,
) -> GlyphMessage:
    """The frame's text as glyphs (its text patches at 2 levels, smallest line `text_px`)."""
    rule = rule or MatchRule()
    w, h = frame.size
    ink, scale, paper, ink_grey, boxes_s = text_bitmap(frame, text_boxes, config, text_px)
    sh, sw = ink.shape
    labels, n = ndimage.label(ink, structure=np.ones((3, 3), dtype=bool))
    slices = ndimage.find_objects(labels)
    comps: list[tuple[int, int, int, int]] = []
    bitmaps: list[np.ndarray] = []
    residual = np.zeros_like(ink)
    for i, sl in enumerate(slices, start=1):
        if sl is None:
            continue
        ys, xs = sl
        bh, bw = ys.stop - ys.start, xs.stop - xs.start
        bitmap = labels[sl] == i
        if max(bh, bw) > MAX_GLYPH_SIDE_PX or bh * bw > MAX_GLYPH_AREA_PX:
            residual[sl] |= bitmap
            continue
        comps.append((xs.start, ys.start, xs.stop, ys.stop))
        bitmaps.append(bitmap)
    enc = _Encoder()
    groups = _groups(comps, boxes_s)
    shapes = _Dictionary(rule, [bitmaps[ci] for group in groups for ci in group])
    c = -1  # the component's place in coding order
    _put_int(enc, _COUNT, len(groups))
    first_x, first_y = 0, 0
    for group in groups:
        _put_int(enc, _COUNT, len(group))
        prev_x1, prev_y1 = 0, 0
        for j, ci in enumerate(group):
            c += 1
            bitmap = bitmaps[ci]
            x0, y0, _x1, _y1 = comps[ci]
            found = shapes.match(c)
            if found is not None:
                # The shape goes where it matched: its box may be a pixel larger or smaller.
                index, oy, ox = found
                bh, bw = shapes.bitmaps[shapes.shapes[index]].shape
                if x0 + ox < 0 or y0 + oy < 0 or x0 + ox + bw > sw or y0 + oy + bh > sh:
                    found = None
                else:
                    x0, y0 = x0 + ox, y0 + oy
            bh, bw = (
                bitmap.shape if found is None else shapes.bitmaps[shapes.shapes[found[0]]].shape
            )
            x1, y1 = x0 + bw, y0 + bh
            if j == 0:
                _put_int(enc, _DX_FIRST, x0 - first_x)
                _put_int(enc, _DY_FIRST, y1 - first_y)
                first_x, first_y = x0, y1
            else:
                _put_int(enc, _DX, x0 - prev_x1)
                _put_int(enc, _DY, y1 - prev_y1)
            prev_x1, prev_y1 = x1, y1
            enc.ctxs.append(_NEW)
            enc.bits.append(1 if found is None else 0)
            if found is None:
                _put_int(enc, _H, bh)
                _put_int(enc, _DH, bw - bh)
                enc.shapes.append((len(enc.ctxs), bitmap))
                shapes.add(c)
            else:
                _put_index(enc, found[0])
    residual_b = b""
    if residual.any():
        residual_b = lzma.compress(np.packbits(residual).tobytes(), preset=6)
    meta = frame_meta(frame, w=w, h=h, sw=sw, sh=sh, paper=paper, ink=ink_grey)
    meta_b = json.dumps(meta, separators=(",", ":")).encode()
    payload = b"".join(
        [
            MAGIC,
            struct.pack("!I", len(meta_b)),
            meta_b,
            struct.pack("!I", len(residual_b)),
            residual_b,
            enc.finish(),
        ]
    )
    return GlyphMessage(payload, scale, len(comps), len(shapes.shapes), int(residual.sum()))


def decode_glyphs(payload: bytes, *, stream_id: str, arrival_wall: float) -> KeyFrame:
    """The key frame rebuilt from `encode_glyphs`'s payload (raises `WireError` if malformed)."""
    try:
        if payload[:3] != MAGIC:
            raise WireError(f"glyph message starts {payload[:3]!r}, not {MAGIC!r}")
        (n_meta,) = struct.unpack_from("!I", payload, 3)
        meta: dict[str, Any] = json.loads(payload[7 : 7 + n_meta])
        start = 7 + n_meta
        (n_res,) = struct.unpack_from("!I", payload, start)
        start += 4
        residual_b = payload[start : start + n_res]
        if len(residual_b) != n_res:
            raise WireError("glyph message: residual cut short")
        stream = payload[start + n_res :]
        w, h, sw, sh = (int(meta[k]) for k in ("w", "h", "sw", "sh"))
        paper, ink_grey = int(meta["paper"]), int(meta["ink"])
    except (struct.error, ValueError, KeyError, TypeError) as e:
        raise WireError(f"malformed glyph message: {e}") from e
    if not (0 < sw <= MAX_SIDE_PX and 0 < sh <= MAX_SIDE_PX):
        raise WireError(f"glyph message of {sw}x{sh}: out of range")
    if not (sw <= w <= 8 * sw and sh <= h <= 8 * sh and w * h <= 4096 * 4096):
        raise WireError(f"glyph message scales {sw}x{sh} to {w}x{h}: out of range")
    if not (0 <= paper <= 255 and 0 <= ink_grey <= 255):
        raise WireError("glyph message: greys out of range")
    ink = np.zeros((sh, sw), dtype=bool)
    if residual_b:
        try:
            inflater = lzma.LZMADecompressor()
            raw = inflater.decompress(residual_b, (sh * sw + 7) // 8 + 1)
        except lzma.LZMAError as e:
            raise WireError(f"glyph message: residual does not inflate: {e}") from e
        if len(raw) != (sh * sw + 7) // 8:
            raise WireError("glyph message: residual is not the picture's size")
        ink |= np.unpackbits(np.frombuffer(raw, dtype=np.uint8))[: sh * sw].reshape(sh, sw) > 0
    dec = _Decoder(stream)
    shapes: list[np.ndarray] = []
    n_groups = _get_int(dec, _COUNT)
    if not 0 <= n_groups <= MAX_GLYPHS:
        raise WireError(f"glyph message with {n_groups} lines")
    total, shape_px = 0, 0
    first_x, first_y = 0, 0
    for _ in range(n_groups):
        n = _get_int(dec, _COUNT)
        total += n
        if n < 0 or total > MAX_GLYPHS:
            raise WireError(f"glyph message with over {MAX_GLYPHS} glyphs")
        prev_x1, prev_y1 = 0, 0
        for j in range(n):
            if j == 0:
                x0 = first_x + _get_int(dec, _DX_FIRST)
                y1 = first_y + _get_int(dec, _DY_FIRST)
                first_x, first_y = x0, y1
            else:
                x0 = prev_x1 + _get_int(dec, _DX)
                y1 = prev_y1 + _get_int(dec, _DY)
            if dec.bit(_NEW):
                bh = _get_int(dec, _H)
                bw = bh + _get_int(dec, _DH)
                if not (0 < bh <= MAX_GLYPH_SIDE_PX and 0 < bw <= MAX_GLYPH_SIDE_PX):
                    raise WireError(f"glyph message: a {bw}x{bh} glyph")
                shape_px += bh * bw
                if len(shapes) >= MAX_SHAPES or shape_px > sw * sh:
                    raise WireError("glyph message: more shapes than its picture holds")
                shapes.append(_get_bitmap(dec, bh, bw))
                bitmap = shapes[-1]
            else:
                index = _get_index(dec)
                if index >= len(shapes):
                    raise WireError(f"glyph message refers to shape {index} of {len(shapes)}")
                bitmap = shapes[index]
            bh, bw = bitmap.shape
            y0 = y1 - bh
            prev_x1, prev_y1 = x0 + bw, y1
            if x0 < 0 or y0 < 0 or x0 + bw > sw or y1 > sh:
                raise WireError(f"glyph message: a glyph at ({x0}, {y0}) outside {sw}x{sh}")
            ink[y0:y1, x0 : x0 + bw] |= bitmap
    grey: np.ndarray = np.where(ink, np.uint8(ink_grey), np.uint8(paper)).astype(np.uint8)
    if (sw, sh) != (w, h):
        grey = cv2.resize(grey, (w, h), interpolation=cv2.INTER_CUBIC)
    return key_frame(meta, grey, stream_id=stream_id, arrival_wall=arrival_wall, what="glyph")


__all__ = ["GlyphMessage", "MatchRule", "decode_glyphs", "encode_glyphs", "text_bitmap"]
