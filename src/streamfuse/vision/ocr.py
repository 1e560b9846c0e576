"""OCR of key frames: one `ocr` event per distinct on-screen text state.

`OcrStage` consumes `KeyFrame`s (link it with `OverloadPolicy.LATEST_ONLY` for live input: a
newer key frame replaces a waiting one, so OCR never builds a backlog; `BLOCK` for offline runs
that must read every slide). Per frame it asks its `ResolutionPolicy` for a plan (detector
resolution, ROI, interval), raises the resolution to the floor the smallest text on the frame
needs, runs the `OcrEngine` (rapidocr + onnxruntime by default) on its worker thread, re-reads
low-confidence lines and empty table cells at full resolution, drops junk lines, arranges the
rest into lines in reading order (`vision.layout`: one line per baseline, a table row's cells
joined by " | ") and emits an `ocr` EventFrame unless the text equals the last emitted state of
the stream (tolerating small OCR noise). docs/ocr-layout.md.

Event fields: `lines` (`text`, `box` [x0, y0, x1, y1] in original frame pixels, `conf`), `text`
(lines joined by newlines), `n_lines`, `resolution` [w, h] of the detector input, `scale`
(detector pixels per frame pixel), `roi`, `ocr_ms`, `mean_conf`, `frame_index`, `t_changed`,
`reason`. `t_start` = `t_end` = media time of the key frame: the text is observed then and holds
until the next `ocr` event, which a live stream cannot know in advance. `latency_ms` runs from
the key frame's arrival.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rapidfuzz import fuzz

from streamfuse.errors import ConfigError, ModelError
from streamfuse.events import OcrLine as OcrLineRecord
from streamfuse.events import OcrPayload
from streamfuse.frames import EventFrame, Frame, now_wall
from streamfuse.models import file_sha256, ort_session_options
from streamfuse.pipeline.queues import OverloadPolicy
from streamfuse.pipeline.stage import Stage
from streamfuse.qos.ladder import align_px
from streamfuse.telemetry.metrics import ModelInfo, instruments
from streamfuse.text import collapse_whitespace
from streamfuse.text.calibration import (
    AnyCalibrator,
    calibrate_ocr_line,
    shipped,
)
from streamfuse.vision.config import FixedPolicy, OcrConfig, VisionConfig
from streamfuse.vision.frames import BBox, KeyFrame, clamp_box, clip_box
from streamfuse.vision.layout import (
    CELL_SEPARATOR,
    LayoutLine,
    find_rules,
    layout,
    ocr_context_features,
    same_row,
)
from streamfuse.vision.policy import FixedResolution, OcrObservation, OcrPlan, ResolutionPolicy
from streamfuse.vision.textsize import floor_side_px, smallest_text_height_px

log = logging.getLogger(__name__)

Box = tuple[float, float, float, float]


#: A recognized word: its text and x-extent (x0, x1) in the same pixels as its line's box.
Word = tuple[str, float, float]


@dataclass(frozen=True, slots=True)
class OcrLine:
    """One recognized text line. `box` is (x0, y0, x1, y1) in original frame pixels; `words`
    the recognizer's words with their x-extents when the engine gives them (the layout splits
    a box between two words where a table column boundary runs through it)."""

    text: str
    box: Box
    conf: float
    words: tuple[Word, ...] = ()
    #: From the layout (`LayoutLine.gap_bridged`, `.inferred_cuts`): the widest gap joined
    #: inside the line, in line heights, and the table's column boundaries only word gutters
    #: showed. Calibration features (docs/calibration.md); 0 for a recognizer's raw line.
    gap_bridged: float = 0.0
    inferred_cuts: int = 0

    def word_spans(self) -> list[tuple[float, float]]:
        return [(x0, x1) for _, x0, x1 in self.words]

    def split_at(self, x: float) -> tuple[OcrLine, OcrLine] | None:
        """The words left of `x` and those right of it as two lines (same confidence)."""
        left = tuple(w for w in self.words if (w[1] + w[2]) / 2 < x)
        right = self.words[len(left) :]
        if not left or not right or any((w[1] + w[2]) / 2 < x for w in right):
            return None
        x0, y0, x1, y1 = self.box
        return (
            OcrLine(" ".join(w[0] for w in left), (x0, y0, left[-1][2], y1), self.conf, left),
            OcrLine(" ".join(w[0] for w in right), (right[0][1], y0, x1, y1), self.conf, right),
        )

    def to_payload(
        self,
        calibrator: AnyCalibrator | None = None,
        *,
        scale: float = 1.0,
        mean_conf: float | None = None,
        n_lines: int = 1,
        context: Mapping[str, float] | None = None,
    ) -> OcrLineRecord:
        """The line as it goes into an `ocr` event (box in whole pixels); with a calibrator,
        `conf` is its probability and `conf_raw` the recognizer's score. The calibrator sees
        what the event records: the rounded box and score, the reading's `scale`, `mean_conf`
        and line count, and the line's `context` among the event's lines
        (`ocr_context_features` of the rounded boxes)."""
        x0, y0, x1, y1 = (round(v) for v in self.box)
        raw = round(self.conf, 3)
        if calibrator is None:
            return OcrLineRecord(
                text=self.text,
                box=(x0, y0, x1, y1),
                conf=raw,
                gap_bridged=round(self.gap_bridged, 2),
                inferred_cuts=self.inferred_cuts,
            )
        gap = round(self.gap_bridged, 2)
        conf = calibrate_ocr_line(
            calibrator,
            self.text,
            (x0, y0, x1, y1),
            raw,
            scale=scale,
            mean_conf=mean_conf,
            n_lines=n_lines,
            gap_bridged=gap,
            inferred_cuts=self.inferred_cuts,
            context=context,
        )
        return OcrLineRecord(
            text=self.text,
            box=(x0, y0, x1, y1),
            conf=conf,
            conf_raw=raw,
            gap_bridged=gap,
            inferred_cuts=self.inferred_cuts,
        )

    def shifted(self, dx: float, dy: float) -> OcrLine:
        x0, y0, x1, y1 = self.box
        words = tuple((t, a + dx, b + dx) for t, a, b in self.words)
        return OcrLine(self.text, (x0 + dx, y0 + dy, x1 + dx, y1 + dy), self.conf, words)


@dataclass(frozen=True, slots=True)
class OcrReading:
    """An engine's raw result for one image (boxes in that image's pixels)."""

    lines: tuple[OcrLine, ...]
    #: Detector input (width, height) in pixels.
    resolution: tuple[int, int]
    ocr_ms: float


class OcrEngine(ABC):
    """A text detector + recognizer. `read` is blocking and runs on a worker thread."""

    def load(self) -> None:  # noqa: B027 - optional hook
        """Load models (called once, off the event loop)."""

    @abstractmethod
    def read(self, image: np.ndarray, det_max_side_px: int) -> OcrReading:
        """Read an RGB uint8 image; the detector input is scaled to `det_max_side_px`."""

    def model_info(self) -> ModelInfo | None:
        """The loaded models (telemetry reports them). Default: unknown."""
        return None


class RapidOcrEngine(OcrEngine):
    """rapidocr 3.x (PP-OCR detector + recognizer in ONNX) on onnxruntime, CPU.

    The detector runs at `det_max_side_px` (`Det.limit_type=max`); the recognizer reads crops of
    the full-resolution image (it normalizes them to 48 px high, so its cost barely depends on
    the input resolution while small text keeps its detail).
    """

    # rapidocr shrinks any input whose long side exceeds this before detection (its default).
    _GLOBAL_MAX_SIDE = 2000

    # Detector side rapidocr is built with; every read sets its own (`read`'s argument).
    _INITIAL_DET_SIDE = 960

    def __init__(self, config: OcrConfig | None = None, *, streams: int = 1) -> None:
        self.config = config or OcrConfig()
        self._engine: Any = None
        self._model_name: str | None = None  # known once loaded
        #: The precision wanted (`OcrConfig.resolve_precision` for `streams` streams sharing
        #: the machine), then the one the loaded models run at: "int8" or "fp32".
        self.precision = self.config.resolve_precision(streams)

    def params(self) -> dict[str, Any]:
        """The rapidocr parameters this engine is built with."""
        c = self.config
        return {
            "Global.use_cls": c.use_cls,
            "Global.text_score": c.min_conf,
            "Global.log_level": "warning",
            "Global.max_side_len": self._GLOBAL_MAX_SIDE,
            "Det.limit_type": "max",
            "Det.limit_side_len": self._INITIAL_DET_SIDE,
            "Rec.rec_batch_num": c.rec_batch_size,
            "EngineConfig.onnxruntime.intra_op_num_threads": c.intra_op_threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": c.inter_op_threads,
        }

    def load(self) -> None:
        if self._engine is not None:
            return
        logging.getLogger("RapidOCR").setLevel(logging.WARNING)
        try:
            from rapidocr import RapidOCR

            self._engine = RapidOCR(params=self.params())
            # Load both models now (rapidocr loads lazily) so the first slide is not slow.
            self._engine(_warmup_image())
        except Exception as e:
            raise ModelError(f"cannot load the rapidocr models: {e}") from e
        if getattr(self._engine, "text_det", None) is None:
            raise ModelError("rapidocr did not load its text detector")
        # rapidocr's own model files (an INT8 detector is a quantized copy of its FP32 one).
        self._model_name = "+".join(
            Path(getattr(m.session.session, "_model_path", "")).stem
            for m in (self._engine.text_det, self._engine.text_rec)
        )
        int8 = int8_model_paths(self._engine) if self.precision == "int8" else None
        self.precision = "int8" if int8 else "fp32"
        if int8:
            fp32 = {
                name: Path(getattr(model.session.session, "_model_path", ""))
                for name, model in (("det", self._engine.text_det), ("rec", self._engine.text_rec))
            }
            try:
                self._rebuild_sessions(int8)
            except ModelError as e:
                log.warning("%s; reading in FP32", e)
                self.precision, int8 = "fp32", None
                self._rebuild_sessions(fp32)
        elif not self.config.ort_allow_spinning:
            self._rebuild_sessions({})
        if int8 or not self.config.ort_allow_spinning:
            self._engine(_warmup_image())  # the new sessions' first run is slow too

    def model_info(self) -> ModelInfo | None:
        if self._model_name is None:
            return None
        return ModelInfo(self._model_name, self.precision, ("rapidocr", "onnxruntime"))

    def _rebuild_sessions(self, paths: dict[str, Path]) -> None:
        """Swap rapidocr's detector/recognizer sessions for ours: `paths` replaces a model
        ("det", "rec"), and our session options apply (rapidocr exposes no session config)."""
        from onnxruntime import InferenceSession

        c = self.config
        for name, model in (("det", self._engine.text_det), ("rec", self._engine.text_rec)):
            holder = getattr(model, "session", None)
            sess = getattr(holder, "session", None)
            path = getattr(sess, "_model_path", None)
            if holder is None or sess is None or path is None:
                log.warning("cannot set onnxruntime options for %s: unexpected rapidocr", model)
                continue
            opts = ort_session_options(
                intra_op_threads=c.intra_op_threads,
                inter_op_threads=c.inter_op_threads,
                allow_spinning=c.ort_allow_spinning,
                cpu_mem_arena=False,
            )
            model_path = str(paths.get(name, path))
            try:
                holder.session = InferenceSession(model_path, opts, providers=sess.get_providers())
            except Exception as e:
                raise ModelError(f"cannot load OCR model {model_path}: {e}") from e

    def read(self, image: np.ndarray, det_max_side_px: int) -> OcrReading:
        if self._engine is None:
            self.load()
        h, w = image.shape[:2]
        # Per-call detector resolution; the detector builds its resize op from this each call.
        self._engine.text_det.limit_side_len = det_max_side_px
        bgr = np.ascontiguousarray(image[..., ::-1]) if image.ndim == 3 else image
        t0 = time.perf_counter()
        # Word boxes come from the recognizer's own character positions (no second model).
        out = self._engine(bgr, return_word_box=True)
        ocr_ms = (time.perf_counter() - t0) * 1000.0
        lines: list[OcrLine] = []
        if getattr(out, "boxes", None) is not None and getattr(out, "txts", None) is not None:
            word_results = getattr(out, "word_results", None) or [()] * len(out.txts)
            for quad, text, score, found in zip(
                out.boxes, out.txts, out.scores, word_results, strict=False
            ):
                q = np.asarray(quad, dtype=np.float64).reshape(-1, 2)
                box = (q[:, 0].min(), q[:, 1].min(), q[:, 0].max(), q[:, 1].max())
                lines.append(
                    OcrLine(str(text), clamp_box(box, (w, h)), float(score), _words(found, w))
                )
        return OcrReading(tuple(lines), _det_size(w, h, det_max_side_px), ocr_ms)


def _words(found: Any, width: int) -> tuple[Word, ...]:
    """rapidocr's word results of one line ((text, score, 4-point box), ...) as words, left to
    right; () when they are missing or do not spell the line's words."""
    out: list[Word] = []
    for item in found or ():
        try:
            text, _, quad = item
            xs = np.asarray(quad, dtype=np.float64).reshape(-1, 2)[:, 0]
        except (TypeError, ValueError):
            return ()
        if str(text).strip():
            out.append(
                (str(text).strip(), max(0.0, float(xs.min())), min(float(width), float(xs.max())))
            )
    out.sort(key=lambda w: w[1])
    return tuple(out)


INT8_DIR = Path(__file__).with_name("ocr_int8")


def int8_model_paths(rapid: Any, folder: Path = INT8_DIR) -> dict[str, Path] | None:
    """Our INT8 model files ("det" and/or "rec") for this rapidocr instance, or None (with a
    warning) when they are missing or were built from other models than the ones it loaded."""
    try:
        sources = json.loads((folder / "manifest.json").read_text())["sources"]
    except (OSError, ValueError, KeyError) as e:
        log.warning("INT8 OCR models unavailable (%s); reading in FP32", e)
        return None
    models = {"det": rapid.text_det, "rec": rapid.text_rec}
    paths: dict[str, Path] = {}
    for name, source in sources.items():
        holder = getattr(models.get(name), "session", None)
        src = str(getattr(getattr(holder, "session", None), "_model_path", ""))
        ours = folder / f"{name}.onnx"
        try:
            same = file_sha256(src) == source["sha256"]
        except (OSError, KeyError, TypeError):
            same = False
        if not same or not ours.is_file():
            log.warning(
                "INT8 OCR %s model was built for %s, rapidocr loaded %s; reading in FP32",
                name,
                source.get("file", "?") if isinstance(source, dict) else "?",
                Path(src).name or "?",
            )
            return None
        paths[name] = ours
    return paths or None


def _det_size(w: int, h: int, det_max_side: int) -> tuple[int, int]:
    """The detector input size rapidocr uses for a (w, h) image (max-side limit, 32-px grid)."""
    scale = min(1.0, RapidOcrEngine._GLOBAL_MAX_SIDE / max(w, h))
    w1, h1 = int(w * scale), int(h * scale)
    ratio = min(1.0, det_max_side / max(w1, h1))
    return (
        align_px(max(1, int(w1 * ratio)), ties="even"),
        align_px(max(1, int(h1 * ratio)), ties="even"),
    )


def _warmup_image() -> np.ndarray:
    import cv2

    img = np.full((64, 320, 3), 255, dtype=np.uint8)
    cv2.putText(img, "warm up 123", (8, 44), cv2.FONT_HERSHEY_SIMPLEX, 1.2, (0, 0, 0), 2)
    return img


# -- text state ------------------------------------------------------------------------------

_DIGITS = re.compile(r"[^0-9]")


def normalize_text(text: str) -> str:
    """Case-folded, whitespace collapsed: the form text states are compared in."""
    return collapse_whitespace(text).casefold()


def same_text_state(
    a: Sequence[OcrLine], b: Sequence[OcrLine], *, line_similarity: float = 0.9
) -> bool:
    """Whether two readings show the same text, allowing small per-line OCR noise.

    Lines are compared pairwise in reading order; letters may differ a little (similarity at
    least `line_similarity`), numbers must match exactly (a changed figure is news).
    """
    ta = [normalize_text(x.text) for x in a]
    tb = [normalize_text(x.text) for x in b]
    if len(ta) == len(tb):
        return all(
            fuzz.ratio(x, y) >= 100.0 * line_similarity and _DIGITS.sub("", x) == _DIGITS.sub("", y)
            for x, y in zip(ta, tb, strict=True)
        )
    # The detector may split or merge a line between readings: compare the characters.
    return "".join(ta).replace(" ", "") == "".join(tb).replace(" ", "")


def line_records(
    lines: Sequence[OcrLine],
    calibrator: AnyCalibrator | None,
    *,
    scale: float,
    mean_conf: float | None,
) -> list[OcrLineRecord]:
    """The lines of one `ocr` event as records: each calibrated with the reading's `scale`,
    `mean_conf` and line count and its context among the event's lines
    (`ocr_context_features` of the rounded boxes, as a recorded event holds them)."""
    context = ocr_context_features([(ln.text, tuple(round(v) for v in ln.box)) for ln in lines])
    return [
        ln.to_payload(calibrator, scale=scale, mean_conf=mean_conf, n_lines=len(lines), context=ctx)
        for ln, ctx in zip(lines, context, strict=True)
    ]


def clean_lines(lines: Sequence[OcrLine], config: OcrConfig) -> list[OcrLine]:
    """Drop junk: empty text, low confidence, specks, unsure one- or two-glyph lines. Text is
    NFKC-normalized (the recognizer sometimes writes full-width forms: "％" for "%")."""
    out = []
    for line in lines:
        text = collapse_whitespace(unicodedata.normalize("NFKC", line.text))
        if not text or line.conf < config.min_conf:
            continue
        n_chars = len(text) - text.count(" ")
        if n_chars <= config.short_line_chars and line.conf < config.short_line_min_conf:
            continue
        if line.box[3] - line.box[1] < config.min_text_height_px:
            continue
        words = tuple(
            (collapse_whitespace(unicodedata.normalize("NFKC", t)), a, b) for t, a, b in line.words
        )
        if " ".join(t for t, _, _ in words) != text:
            words = ()  # they must spell the line, or a split could change its text
        out.append(OcrLine(text, line.box, line.conf, words))
    return out


#: What the recognizer reads a drawn bullet mark (a square, dot, ring, triangle, dash) as.
BULLET_MARKS = frozenset("•◦‣⁃∙·▪▫■□●○◆◇►▸▹▶▷➢➤→»–—✓✔口o")
#: Marks that are also text ("- key: value" in code): a bullet only when boxed on their own.
BOXED_BULLET_MARKS = BULLET_MARKS | frozenset("-*+")


_GLUED_MARK = re.compile("[" + re.escape("".join(sorted(BULLET_MARKS - {"o"}))) + r"](?=\w)")


def drop_bullets(lines: Sequence[OcrLine], *, reach: float = 3.0) -> list[OcrLine]:
    """`lines` without drawn bullet marks read as text (the truth convention: a bullet is a
    shape, not a character). A mark is a bullet only at the start of a line and followed by a
    gap: a box holding one mark, with text starting within `reach` text heights to its right
    on its row and nothing within that reach to its left; or a line with nothing to its left
    whose first word is one mark (not "-", "*", "+") followed by a space, or starts with a
    symbol mark glued to a word ("■Why": the gap read as no space)."""
    out = []
    for ln in lines:
        x0, y0, x1, y1 = ln.box
        h = max(1.0, y1 - y0)
        row = [o for o in lines if o is not ln and same_row(o.box, ln.box)]
        if any(x0 - reach * h <= o.box[2] <= x0 + 0.2 * h and o.box[0] < x0 for o in row):
            out.append(ln)  # not at the start of a line
            continue
        if ln.text in BOXED_BULLET_MARKS:
            after = [
                o
                for o in row
                if -0.2 * h <= o.box[0] - x1 <= reach * (o.box[3] - o.box[1])
                and any(c.isalnum() for c in o.text)
                and h <= 1.5 * (o.box[3] - o.box[1])
            ]
            if after:
                continue
        head, _, rest = ln.text.partition(" ")
        if head in BULLET_MARKS and rest:
            words = ln.words[1:] if ln.words and ln.words[0][0] == head else ()
            box = (words[0][1], y0, x1, y1) if words else ln.box
            ln = OcrLine(rest, box, ln.conf, words)
        elif _GLUED_MARK.match(ln.text):
            # The space after a symbol mark not read ("■Why"); a glued "o" is left alone, as
            # it may begin a word ("oAuth").
            words = ((ln.words[0][0][1:], *ln.words[0][1:]), *ln.words[1:]) if ln.words else ()
            ln = OcrLine(ln.text[1:], ln.box, ln.conf, words)
        out.append(ln)
    return out


def drop_double_reads(lines: Sequence[OcrLine]) -> list[OcrLine]:
    """`lines` less each word read twice where two boxes of one row overlap: the detector's
    boxes of two close cells can share the glyphs between them, and the recognizer then
    reads those glyphs in both ("310 USD t" beside "the faculty"). The end word of one box
    that lies inside the other box, over a word there that contains it, is the copy and is
    dropped (only for lines with word boxes)."""
    out = list(lines)
    for i, a in enumerate(out):
        if len(a.words) < 2:
            continue
        for b in out:
            if b is a or not same_row(a.box, b.box):
                continue
            ends = (a.words[-1], a.words[0]) if b.box[0] > a.box[0] else (a.words[0],)
            for w in ends:
                inside = b.box[0] <= w[1] and w[2] <= b.box[2]
                twin = any(
                    min(w[2], v[2]) - max(w[1], v[1]) >= 0.5 * (w[2] - w[1])
                    and w[0].casefold() in v[0].casefold()
                    for v in b.words
                )
                if inside and twin and len(a.words) >= 2:
                    words = tuple(x for x in a.words if x is not w)
                    x0, y0, x1, y1 = a.box
                    a = OcrLine(
                        " ".join(x[0] for x in words),
                        (words[0][1], y0, words[-1][2], y1) if words else a.box,
                        a.conf,
                        words,
                    )
                    out[i] = a
                    break
    return out


def join_lines(lines: Sequence[LayoutLine[OcrLine]]) -> list[OcrLine]:
    """One `OcrLine` per layout line: boxes on one baseline joined by spaces, a table row's
    cells joined by `CELL_SEPARATOR`; the confidence is the character-weighted mean."""
    out = []
    for line in lines:
        if line.cells is None:
            text = " ".join(it.text for it in line.items)
        else:
            text = CELL_SEPARATOR.join(" ".join(it.text for it in cell) for cell in line.cells)
        conf = _weighted_conf(line.items)
        out.append(
            OcrLine(text, line.box, conf, (), line.gap_bridged, line.inferred_cuts),
        )
    return out


def _weighted_conf(lines: Sequence[OcrLine]) -> float:
    """Mean confidence weighted by characters (the recognizer's score is a per-line mean)."""
    weights = [max(1, len(ln.text)) for ln in lines]
    return sum(w * ln.conf for w, ln in zip(weights, lines, strict=True)) / sum(weights)


def _without_overlaps(lines: Sequence[OcrLine]) -> list[OcrLine]:
    """`lines` less each one whose box lies half or more inside a surer one's x-extent."""
    kept: list[OcrLine] = []
    for ln in sorted(lines, key=lambda n: -n.conf):
        width = max(1.0, ln.box[2] - ln.box[0])
        if all(min(ln.box[2], k.box[2]) - max(ln.box[0], k.box[0]) < 0.5 * width for k in kept):
            kept.append(ln)
    return kept


def drop_stray_glyphs(lines: Sequence[OcrLine], config: OcrConfig) -> list[OcrLine]:
    """Drop short lines (see `OcrConfig.short_line_chars`) much taller than the text around
    them: the recognizer reading a letter into a picture region, not a giant letter."""
    if len(lines) < 2:
        return list(lines)
    heights = sorted(ln.box[3] - ln.box[1] for ln in lines)
    median = heights[len(heights) // 2]
    limit = config.stray_glyph_height_ratio * median
    return [
        ln
        for ln in lines
        if len(ln.text.replace(" ", "")) > config.short_line_chars or ln.box[3] - ln.box[1] <= limit
    ]


def _center_inside(box: Box, roi: BBox) -> bool:
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return roi[0] <= cx < roi[2] and roi[1] <= cy < roi[3]


# -- the stage -------------------------------------------------------------------------------


@dataclass
class _StreamText:
    lines: list[OcrLine] = field(default_factory=list)  # last emitted state
    last_start_wall: float | None = None
    reads: int = 0
    emitted: int = 0
    #: The key frame whose lines an edge read (the last emitted state came from it), and the
    #: mean score of those lines: a read here of the same frame replaces them only if surer.
    edge_index: int | None = None
    edge_conf: float | None = None


class OcrStage(Stage):
    """KeyFrame -> `ocr` EventFrame per distinct text state (see the module docstring).

    Without `policy` the stage reads with `FixedResolution` for the `fixed` policy of a
    `VisionConfig` (or the `fixed` defaults); an adaptive policy needs the job's signals and
    pacing, so build it with `streamfuse.vision.adaptive.make_policy` and pass it in.
    """

    input_types = (KeyFrame,)

    def __init__(
        self,
        config: OcrConfig | VisionConfig | None = None,
        *,
        policy: ResolutionPolicy | None = None,
        engine: OcrEngine | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name, threads=1)
        fixed = FixedPolicy()
        if isinstance(config, VisionConfig):
            if policy is None and not isinstance(config.policy, FixedPolicy):
                raise ConfigError(
                    f"vision.policy is {config.policy.kind!r}: build it with "
                    "streamfuse.vision.adaptive.make_policy and pass it as policy="
                )
            if isinstance(config.policy, FixedPolicy):
                fixed = config.policy
            config = config.ocr
        self.config = config or OcrConfig()
        self.policy = policy or FixedResolution.from_config(fixed)
        self.engine = engine or RapidOcrEngine(self.config)
        self._calibrator = shipped("ocr") if self.config.calibrate else None
        self._streams: dict[str, _StreamText] = {}

    async def setup(self) -> None:
        await self.run_blocking(self.engine.load)

    def model_info(self) -> ModelInfo | None:
        return self.engine.model_info()

    def _read(
        self, image: np.ndarray, frame_wh: tuple[int, int], scale: float
    ) -> tuple[OcrReading, float, int]:
        """Read `image` (the frame or a region of it) at `scale` detector pixels per frame
        pixel, raised to the rung floor the smallest text needs; then read its low-confidence
        lines again at full resolution. Returns the reading, the scale and detector side used.
        (Runs on the worker thread.)"""
        c = self.config
        long_side = max(frame_wh)
        if c.min_text_px is not None and scale < 1.0:
            floor = floor_side_px(
                smallest_text_height_px(image), long_side, min_text_px=c.min_text_px
            )
            if floor is not None and floor > scale * long_side:
                scale = min(1.0, floor / long_side)
        det_side = max(32, round(max(image.shape[:2]) * scale))
        reading = self.engine.read(image, det_side)
        if c.reread_below_conf is not None and scale < 1.0:
            reading = self._reread(image, reading)
        return reading, scale, det_side

    def _reread(self, image: np.ndarray, reading: OcrReading) -> OcrReading:
        """Each low-confidence line read again at full resolution from the strip of the image
        around it (full width: at a low rung the detector cuts a small line short or splits
        it, so its box may miss the rest of it). The new lines on that line replace it, and
        any other box they cover, when they are surer."""
        c = self.config
        low = sorted(
            (ln for ln in reading.lines if c.min_conf <= ln.conf < (c.reread_below_conf or 0)),
            key=lambda ln: ln.conf,
        )[: c.max_rereads]
        if not low:
            return reading
        h_img = image.shape[0]
        lines = list(reading.lines)
        ocr_ms = reading.ocr_ms
        for ln in low:
            if ln not in lines:  # replaced already by an earlier re-read
                continue
            x0, y0, x1, y1 = ln.box
            pad = (y1 - y0) / 2
            top, bottom = max(0, int(y0 - pad)), min(h_img, int(y1 + pad) + 1)
            strip = image[top:bottom]
            if strip.shape[0] < 8:
                continue
            again = self.engine.read(strip, max(strip.shape[:2]))
            ocr_ms += again.ocr_ms
            # Only what lies on this line and overlaps it: the strip holds its neighbours too.
            new = [
                n.shifted(0, top)
                for n in again.lines
                if y0 <= top + (n.box[1] + n.box[3]) / 2 <= y1 and n.box[0] < x1 and n.box[2] > x0
            ]
            if not new or _weighted_conf(new) <= ln.conf:
                continue
            nx0, nx1 = min(n.box[0] for n in new), max(n.box[2] for n in new)
            covered = [
                o
                for o in lines
                if o is ln
                or (
                    y0 <= (o.box[1] + o.box[3]) / 2 <= y1
                    and min(o.box[2], nx1) - max(o.box[0], nx0) > 0.5 * (o.box[2] - o.box[0])
                )
            ]
            at = min(lines.index(o) for o in covered)
            lines = [o for o in lines if all(o is not x for x in covered)]
            lines[at:at] = new
        return OcrReading(tuple(lines), reading.resolution, ocr_ms)

    def _arrange(self, lines: list[OcrLine], image: np.ndarray, tables: bool) -> list[OcrLine]:
        """Lines in reading order, one per baseline or table row; a table's empty cells read
        again (worker thread: the table check and the re-read look at the frame `image`)."""
        rules = partial(find_rules, image) if tables else None
        kept = drop_double_reads(drop_bullets(drop_stray_glyphs(lines, self.config)))
        arranged = layout(kept, self.config.layout(), rules)
        return join_lines(self._fill_empty_cells(image, arranged))

    def _fill_empty_cells(
        self, image: np.ndarray, lines: list[LayoutLine[OcrLine]]
    ) -> list[LayoutLine[OcrLine]]:
        """A table cell left empty in a column that at least two other rows fill is read again
        from a crop of that cell at full resolution: short cells ("3 %") are the ones the
        detector misses or the short-line filter drops, and the table says text belongs there.
        What the crop holds is kept at `min_conf`, without the short-line rule."""
        c = self.config
        budget = c.max_rereads
        h_img, w_img = image.shape[:2]
        out = []
        for ln in lines:
            if ln.cells is None or ln.columns is None or budget <= 0 or all(ln.cells):
                out.append(ln)
                continue
            table = [o for o in lines if o.columns == ln.columns and o is not ln and o.cells]
            cells = list(ln.cells)
            found: list[OcrLine] = []
            y0 = min(it.box[1] for it in ln.items)
            y1 = max(it.box[3] for it in ln.items)
            for k, cell in enumerate(ln.cells):
                filled = sum(1 for o in table if o.cells and o.cells[k])
                if cell or filled < 2 or budget <= 0:
                    continue
                budget -= 1
                x0, x1 = ln.columns[k]
                pad = (y1 - y0) / 2
                left = ln.columns[k - 1][1] if k > 0 else x0 - 2 * pad
                right = ln.columns[k + 1][0] if k + 1 < len(ln.columns) else x1 + 2 * pad
                cx0, cx1 = max(0, int(left)), min(w_img, int(right) + 1)
                cy0, cy1 = max(0, int(y0 - pad)), min(h_img, int(y1 + pad) + 1)
                crop = image[cy0:cy1, cx0:cx1]
                if crop.shape[0] < 8 or crop.shape[1] < 8:
                    continue
                again = self.engine.read(crop, max(crop.shape[:2]))
                new = [
                    OcrLine(unicodedata.normalize("NFKC", n.text).strip(), n.box, n.conf).shifted(
                        cx0, cy0
                    )
                    for n in again.lines
                    if n.conf >= c.min_conf
                    and y0 <= cy0 + (n.box[1] + n.box[3]) / 2 <= y1
                    and n.text.strip()
                ]
                # The crop may box one cell twice ("3%" and "%"): the surer of overlapping boxes.
                new = _without_overlaps(new)
                if new:
                    cells[k] = tuple(sorted(new, key=lambda n: n.box[0]))
                    found.extend(new)
            if found:
                items = tuple(sorted((*ln.items, *found), key=lambda n: n.box[0]))
                out.append(LayoutLine(items, tuple(cells), ln.columns, ln.inferred_cuts))
            else:
                out.append(ln)
        return out

    def _arrange_read(self, lines: list[OcrLine]) -> list[OcrLine]:
        """Lines another node read (no pixels here): the same junk filters and layout as a
        read of ours, without what needs the picture (table rules, re-reading empty cells)."""
        kept = drop_double_reads(drop_bullets(drop_stray_glyphs(lines, self.config)))
        return join_lines(layout(kept, self.config.layout(), None))

    async def _process_read(self, frame: KeyFrame, state: _StreamText) -> AsyncIterator[Frame]:
        """A key frame the edge already read (`KeyFrame.read_lines`): its lines through our
        filters and layout, emitted as a reading of ours would be, marked `read_by` edge."""
        assert frame.read_lines is not None
        w, h = frame.size
        raw = [OcrLine(text, clamp_box(box, (w, h)), conf) for text, box, conf in frame.read_lines]
        lines = self._arrange_read(clean_lines(raw, self.config))
        mean_conf = float(np.mean([ln.conf for ln in lines])) if lines else None
        det_side = frame.read_det_side_px or max(w, h)
        scale = min(1.0, det_side / max(w, h))
        state.edge_index, state.edge_conf = frame.index, mean_conf
        if not self._new_text(state, lines):
            return
        yield self._event(
            frame,
            lines,
            mean_conf,
            _det_size(w, h, det_side),
            scale,
            (0, 0, w, h),
            frame.read_ms,
            read_by="edge",
        )

    def _new_text(self, state: _StreamText, lines: list[OcrLine]) -> bool:
        """Whether `lines` differ from the stream's last emitted text; if so they become it."""
        if same_text_state(lines, state.lines, line_similarity=self.config.dedup_line_similarity):
            return False
        state.lines = lines
        state.emitted += 1
        return True

    def _event(
        self,
        frame: KeyFrame,
        lines: list[OcrLine],
        mean_conf: float | None,
        resolution: tuple[int, int],
        scale: float,
        roi: BBox,
        ocr_ms: float,
        *,
        read_by: Literal["edge"] | None = None,
    ) -> EventFrame:
        mean_raw = None if mean_conf is None else round(mean_conf, 3)
        records = line_records(lines, self._calibrator, scale=round(scale, 4), mean_conf=mean_raw)
        return EventFrame(
            stream_id=frame.stream_id,
            t_media=frame.t_media,
            t_end=frame.t_media,
            arrival_wall=frame.arrival_wall,
            payload=OcrPayload(
                lines=records,
                text="\n".join(ln.text for ln in lines),
                n_lines=len(lines),
                resolution=resolution,
                scale=round(scale, 4),
                roi=roi,
                ocr_ms=round(ocr_ms, 1),
                mean_conf=mean_raw,
                frame_index=frame.index,
                t_changed=round(frame.t_changed, 3),
                reason=frame.reason,
                read_by=read_by,
            ),
        )

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, KeyFrame)
        state = self._streams.setdefault(frame.stream_id, _StreamText())
        if frame.read_lines is not None:
            async for event in self._process_read(frame, state):
                yield event
            return
        plan = self.policy.plan(frame)
        if plan.min_interval_s > 0 and state.last_start_wall is not None:
            wait_s = state.last_start_wall + plan.min_interval_s - now_wall()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
                if self.backlog > 0 and self.input_policy is not OverloadPolicy.BLOCK:
                    return  # rate-limited: a newer key frame arrived meanwhile, read that one
        start = now_wall()
        state.last_start_wall = start
        w, h = frame.size
        roi = _clip_roi(plan.roi, w, h)
        full = roi == (0, 0, w, h)
        image = frame.image if full else frame.image[roi[1] : roi[3], roi[0] : roi[2]]
        # The plan's resolution is for the whole frame; a ROI is read at the same scale, so a
        # smaller region costs proportionally less detector work.
        scale = min(1.0, plan.det_max_side_px / max(w, h))
        reading, scale, det_side = await self.run_blocking(self._read, image, (w, h), scale)
        lines = clean_lines(reading.lines, self.config)
        if not full:
            lines = [ln.shifted(roi[0], roi[1]) for ln in lines]
            if plan.carry_over:
                lines += [ln for ln in state.lines if not _center_inside(ln.box, roi)]
        lines = await self.run_blocking(self._arrange, lines, frame.image, self.config.tables)
        state.reads += 1
        mean_conf = float(np.mean([ln.conf for ln in lines])) if lines else None
        self.policy.observe(
            OcrObservation(
                stream_id=frame.stream_id,
                t_media=frame.t_media,
                ocr_ms=reading.ocr_ms,
                wait_ms=max(0.0, start - frame.arrival_wall) * 1000.0,
                resolution=reading.resolution,
                scale=scale,
                roi=roi,
                n_lines=len(lines),
                mean_conf=mean_conf,
                backlog=self.backlog,
            )
        )
        ins, attrs = instruments(), {"stage": self.name}
        ins.ocr_resolution.record(reading.resolution[1], attrs)
        ins.ocr_det_side.record(det_side, attrs)
        if _edge_read_kept(state, frame.index, mean_conf):
            log.debug("t=%.3f: the edge's read of %d kept", frame.t_media, frame.index)
            return
        state.edge_index = state.edge_conf = None
        if not self._new_text(state, lines):
            log.debug("t=%.3f: text unchanged, nothing emitted", frame.t_media)
            return
        yield self._event(frame, lines, mean_conf, reading.resolution, scale, roi, reading.ocr_ms)


def _edge_read_kept(state: _StreamText, index: int, mean_conf: float | None) -> bool:
    """Whether our read of key frame `index` leaves the edge's read of it in place: pixels of
    a frame the edge read (a refinement) replace its lines only if we are surer of them (the
    edge read the original picture, we a coded copy)."""
    if state.edge_index is None or state.edge_index != index:
        return False
    return mean_conf is None or (state.edge_conf is not None and mean_conf <= state.edge_conf)


def _clip_roi(roi: BBox | None, w: int, h: int) -> BBox:
    return (0, 0, w, h) if roi is None else clip_box(roi, (w, h))


__all__ = [
    "OcrEngine",
    "OcrLine",
    "OcrPlan",
    "OcrReading",
    "OcrStage",
    "RapidOcrEngine",
    "clean_lines",
    "drop_bullets",
    "drop_double_reads",
    "drop_stray_glyphs",
    "join_lines",
    "normalize_text",
    "same_text_state",
]
