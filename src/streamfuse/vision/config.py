"""Configuration of the vision path (change detection + OCR + resolution policy), validated
with pydantic. `VisionConfig.policy` is one variant per policy kind (`fixed | dynamic |
article`), each holding all of its own settings; the defaults here are the ones the app runs.

Defaults are chosen to generalize across fonts, layouts, resolutions and mild video noise
(thresholds are relative: fractions of the picture, grey levels of a resolution-independent
thumbnail, seconds rather than frames), not tuned to one clip.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from streamfuse.qos.controllers import ArticleRuleConfig, FeedbackControllerConfig
from streamfuse.qos.smoothing import JumpSuppressionConfig
from streamfuse.vision.layout import LayoutConfig


class ChangeDetectorConfig(BaseModel):
    """When a video frame is worth reading: the picture changed, then held still."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    thumb_width_px: int = Field(
        160,
        ge=32,
        le=640,
        description="Width of the grey thumbnail frames are compared on (height keeps the "
        "aspect). 160 px makes one thumbnail cell 8x8 px of a 720p frame, 12x12 of 1080p.",
    )
    change_delta: int = Field(
        24,
        ge=1,
        le=255,
        description="A thumbnail cell counts as changed since the last key frame when its grey "
        "level moved by more than this (after removing a global brightness shift).",
    )
    min_changed_frac: float = Field(
        0.004,
        ge=0.0,
        le=1.0,
        description="Fraction of thumbnail cells that must have changed since the last key "
        "frame to re-read the picture. 0.4% ignores a moving mouse pointer (~0.1-0.2% at "
        "720p) but catches a new text line; a single short word edit may stay below it.",
    )
    still_delta: int = Field(
        8,
        ge=1,
        le=255,
        description="Grey-level tolerance for 'still': a frame is still while few cells differ "
        "from the first frame of the current still run by more than this. Measured against "
        "that anchor, not the previous frame, so slow fades and wipes do not look still.",
    )
    still_max_frac: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Fraction of cells allowed to move while the picture counts as still "
        "(local motion such as a pointer). Default: same as `min_changed_frac`.",
    )
    settle_s: float = Field(
        0.1,
        ge=0.0,
        le=2.0,
        description="How long a changed picture must hold still before it is read, so "
        "transitions are not OCR'd half-drawn (0.1 s = 3 frames at 30 fps).",
    )
    max_wait_s: float = Field(
        2.0,
        ge=0.1,
        le=60.0,
        description="Read a changed picture after this long even if it never settles "
        "(video or animation inside a slide, camera shake), so text is not starved.",
    )
    content_delta: int = Field(
        8,
        ge=1,
        le=255,
        description="A thumbnail cell holds content (for the key frame's `content_bbox`) when "
        "it differs from the median (background) grey level by more than this.",
    )
    compensate_brightness: bool = Field(
        True,
        description="Subtract the median thumbnail difference before thresholding, so an "
        "exposure or brightness drift is not mistaken for new content.",
    )

    @property
    def still_frac(self) -> float:
        return self.min_changed_frac if self.still_max_frac is None else self.still_max_frac


class OcrConfig(BaseModel):
    """rapidocr + onnxruntime settings and the post-processing of its output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    precision: Literal["auto", "int8", "fp32"] = Field(
        "auto",
        description="Text detector precision. `int8`: a statically quantized copy of rapidocr's "
        "detector shipped with streamfuse (`scripts/quantize_ocr.py`), used only while it "
        "matches the installed rapidocr model, else FP32 with a warning. `fp32`: rapidocr's own "
        "model. `auto` (default): `resolve_precision`, INT8 when several streams share the "
        "machine, FP32 for one (measurements: docs/adaptive-vision.md).",
    )
    rec_batch_size: int = Field(
        1,
        ge=1,
        le=64,
        description="Text lines per recognizer call (rapidocr `Rec.rec_batch_num`). A batch is "
        "padded to its widest line, so on a CPU one line per call is cheaper and never mixes a "
        "line with another line's padding (figures: docs/design.md, defaults).",
    )
    use_cls: bool = Field(
        False,
        description="Run the text-direction classifier (only needed for upside-down text; "
        "it adds a model call per line).",
    )
    intra_op_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="onnxruntime intra-op threads per OCR model. 1-2 on a 2-core machine "
        "that also runs speech recognition.",
    )
    inter_op_threads: int = Field(1, ge=1, le=8, description="onnxruntime inter-op threads.")
    ort_allow_spinning: bool = Field(
        False,
        description="Let onnxruntime's idle worker threads busy-wait for work. Off by default: "
        "on a small shared CPU spinning burns CPU that speech recognition needs and is not "
        "faster under contention (figures: docs/design.md, defaults).",
    )
    min_conf: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Recognized lines below this confidence are dropped as junk.",
    )
    short_line_chars: int = Field(
        2,
        ge=0,
        le=10,
        description="Lines of at most this many non-space characters are held to "
        "`short_line_min_conf`: isolated shapes (a mouse pointer, an icon, a bullet) are "
        "often read as one glyph with middling confidence.",
    )
    short_line_min_conf: float = Field(
        0.9,
        ge=0.0,
        le=1.0,
        description="Confidence a short line (see `short_line_chars`) needs to be kept.",
    )
    min_text_height_px: int = Field(
        6,
        ge=0,
        le=200,
        description="Boxes shorter than this (original pixels) are dropped as specks.",
    )
    dedup_line_similarity: float = Field(
        0.9,
        ge=0.5,
        le=1.0,
        description="A new reading repeats the last emitted text state (and is not emitted) "
        "when it has the same number of lines and each line matches its counterpart with at "
        "least this similarity (normalized Indel ratio, case- and whitespace-insensitive) "
        "and the same digits.",
    )
    row_overlap: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Two boxes are on one row when their vertical overlap is at least this "
        "fraction of the shorter box's height (reading order).",
    )
    column_gap_px: float = Field(
        2.0,
        ge=0.5,
        le=20.0,
        description="Minimum empty vertical gutter, in multiples of the median text height, "
        "that separates two columns (reading order).",
    )

    cell_gap: float = Field(
        0.6,
        gt=0.0,
        le=10.0,
        description="Boxes of one row further apart than this many text heights are separate "
        "cells (table detection); closer boxes are one phrase the detector split.",
    )
    band_gap: float = Field(
        1.0,
        gt=0.0,
        le=20.0,
        description="An empty band at least this many median text heights high sets the top "
        "row (a title) or the bottom row (a footer) apart from a column layout (reading order).",
    )
    min_text_px: float | None = Field(
        7.0,
        gt=0.0,
        le=64.0,
        description="Rung floor: the detector side is raised (up to the frame's own size) "
        "until the smallest text line found on the picture (`vision.textsize`, a direct "
        "estimate from glyph strokes) is at least this many pixels high at the detector's "
        "input, whatever the policy chose. On the dev set a 14 px footer vanished below 5.6 "
        "px. None: no floor.",
    )
    reread_below_conf: float | None = Field(
        0.9,
        ge=0.0,
        le=1.0,
        description="A line read below this confidence at a reduced detector scale is read "
        "again from a crop around it at full resolution, and replaced when the new reading is "
        "surer. None: never.",
    )
    max_rereads: int = Field(
        4, ge=0, le=64, description="At most this many low-confidence lines re-read per frame."
    )
    stray_glyph_height_ratio: float = Field(
        3.0,
        gt=1.0,
        le=50.0,
        description="A short line (`short_line_chars`) more than this many times taller than "
        "the median line is dropped: a letter read into a picture.",
    )
    tables: bool = Field(
        True,
        description="Read tables row by row, cells in column order joined by ' | ': aligned "
        "rows count as a table when a rule, stripe or border is drawn between its rows or "
        "columns (docs/ocr-layout.md).",
    )
    calibrate: bool = Field(
        True,
        description="Publish each line's `conf` through the shipped calibrator (P(the line is "
        "read exactly), docs/calibration.md), keeping the recognizer's score as `conf_raw`. "
        "Thresholds in this config always apply to the raw score.",
    )

    def layout(self) -> LayoutConfig:
        """The layout thresholds of this config (`streamfuse.vision.layout`)."""
        return LayoutConfig(
            row_overlap=self.row_overlap,
            column_gap=self.column_gap_px,
            cell_gap=self.cell_gap,
            band_gap=self.band_gap,
        )

    def resolve_precision(self, streams: int = 1) -> Literal["int8", "fp32"]:
        """The detector precision to load for a job reading `streams` streams at once.

        `auto` is INT8 when several streams share the machine (their OCR reads are then the
        contended resource) and FP32 for one (single-stream live runs with INT8 showed a
        higher ASR p95); an OCR stage built on its own counts as one stream.
        """
        if self.precision != "auto":
            return self.precision
        return "int8" if streams > 1 else "fp32"


# ----------------------------------------------------------------------------------------------
# Resolution policies: one variant per `kind`, each holding all of its own settings.

PolicyKind = Literal["fixed", "dynamic", "article"]


class FixedPolicy(BaseModel):
    """The same detector resolution and interval for every key frame, feedback ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fixed"] = "fixed"
    det_max_side_px: int = Field(
        960,
        ge=64,
        le=4096,
        description="Longest side of the text detector input (rapidocr `Det.limit_type=max`, "
        "`Det.limit_side_len`); frames are scaled down to it, never up. Recognition always "
        "reads crops of the full-resolution frame.",
    )
    content_crop: bool = Field(
        True,
        description="Read only the key frame's content region (everything that is not plain "
        "background), at the frame's detector scale: no text can lie outside it. A busy "
        "background simply yields the whole frame.",
    )
    min_interval_s: float = Field(
        0.0,
        ge=0.0,
        le=60.0,
        description="Minimum time between two OCR reads of one stream (0 = as often as key "
        "frames come). A newer key frame arriving during the wait replaces the waiting one.",
    )


class _AdaptivePolicy(BaseModel):
    """What the feedback-driven policies share: jump suppression, latency smoothing, ROI."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    suppression: JumpSuppressionConfig = Field(
        default_factory=JumpSuppressionConfig, description="Dwell, rate limit, blend (F16)."
    )
    latency_alpha: float = Field(
        0.6,
        gt=0.0,
        le=1.0,
        description="Weight of the newest read in the latency average the controller sees.",
    )
    roi_focus: bool = Field(
        True,
        description="Read the smaller of the key frame's content region and its changed "
        "region plus a margin (lines outside a changed region are carried over). False: the "
        "changed region, padded and shrunk to the decision's ROI ratio.",
    )
    roi_margin_frac: float = Field(
        0.03,
        ge=0.0,
        le=0.5,
        description="Margin added around the changed region, as a fraction of the frame's "
        "short side (the change detector's region is already padded by one thumbnail cell).",
    )
    whole_frame_above: float = Field(
        0.8,
        gt=0.0,
        le=1.0,
        description="Read the whole frame when the padded changed region covers at least "
        "this fraction of it (a new slide: cropping would save little).",
    )


class DynamicPolicy(_AdaptivePolicy):
    """The default: a feedback controller steering each stream to the OCR latency budget."""

    kind: Literal["dynamic"] = "dynamic"
    controller: FeedbackControllerConfig = Field(
        default_factory=FeedbackControllerConfig,
        description="The latency-budget controller (`controller.budget_s` is the OCR latency "
        "budget). Rung indices refer to the ladder clipped to the frame; offline (not "
        "realtime) the OCR interval stays at `base_interval_s`: a lossless input would only "
        "skip key frames.",
    )
    start_side_px: int | None = Field(
        640,
        ge=32,
        le=8192,
        description="Detector long side each stream starts at (nearest rung of its ladder, "
        "within the controller's top and floor rungs): a slow start, the first reads are cheap "
        "whatever the load and the controller climbs while the budget allows. None: start at "
        "`controller.start_rung`. Setting both is an error.",
    )

    @model_validator(mode="after")
    def _one_start(self) -> DynamicPolicy:
        if self.start_side_px is not None and self.controller.start_rung is not None:
            raise ValueError("give start_side_px or controller.start_rung, not both")
        return self


class ArticlePolicy(_AdaptivePolicy):
    """The article's F15 rule: degrade on high ASR latency, low confidence and a busy machine."""

    kind: Literal["article"] = "article"
    rule: ArticleRuleConfig = Field(
        default_factory=ArticleRuleConfig,
        description="Thresholds, the two sizes, the ROI ratio and the OCR interval of the rule.",
    )
    scale_to_frame: bool = Field(
        True,
        description="Read the rule's 1920x1080 / 1280x720 as 'native size / two thirds of it', "
        "so the rule also degrades streams that are not 1080p (replaces the rule's sizes).",
    )


PolicyConfig = Annotated[FixedPolicy | DynamicPolicy | ArticlePolicy, Field(discriminator="kind")]
"""How OCR chooses resolution, region and interval per key frame (`VisionConfig.policy`)."""


class VisionConfig(BaseModel):
    """The vision path: change detection feeding OCR."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    change: ChangeDetectorConfig = Field(default_factory=ChangeDetectorConfig)
    ocr: OcrConfig = Field(default_factory=OcrConfig)
    policy: PolicyConfig = Field(
        default_factory=DynamicPolicy,
        description="Resolution policy: `dynamic` (default: feedback controller on the OCR "
        "latency budget, changed-region ROI, jump suppression), `fixed` (one detector side, "
        "content region) or `article` (the article's F15 rule). Comparison: "
        "docs/adaptive-vision.md.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> VisionConfig:
        if self.change.still_frac > 0.5:
            raise ValueError(
                f"change.still_max_frac={self.change.still_frac} would call a slide change still"
            )
        return self


__all__ = [
    "ArticlePolicy",
    "ChangeDetectorConfig",
    "DynamicPolicy",
    "FixedPolicy",
    "OcrConfig",
    "PolicyConfig",
    "PolicyKind",
    "VisionConfig",
]
