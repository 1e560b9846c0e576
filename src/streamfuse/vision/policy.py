"""How much to look at: the OCR stage asks a `ResolutionPolicy` before every read.

Per key frame the policy returns an `OcrPlan` (detector resolution, region of interest, minimum
interval since the previous read); after the read the stage reports an `OcrObservation`
(latency, confidence, what ran) through `observe`, so feedback controllers (dynamic resolution
ladders, ROI focus, QoS rules) plug in without touching the stage. `FixedResolution` is the
default: the same plan for every frame, feedback ignored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

from streamfuse.errors import ConfigError
from streamfuse.vision.config import FixedPolicy
from streamfuse.vision.frames import BBox, KeyFrame


@dataclass(frozen=True, slots=True)
class OcrPlan:
    """What one OCR read should do.

    `det_max_side_px`: the frame's longest side as the text detector sees it (the frame is
    scaled down to it, never up; the detector rounds each side to a multiple of 32). `roi`:
    (x0, y0, x1, y1) in original pixels to read, None for the whole frame; it is read at the
    same scale as the frame would be (a 0.6-area ROI costs ~0.6 of the detector work).
    `carry_over`: lines of the previous reading outside the ROI still stand (the ROI is what
    changed); False when nothing outside it can hold text (a content crop). `min_interval_s`:
    do not start a read sooner than this after the previous one started.
    """

    det_max_side_px: int = 960
    roi: BBox | None = None
    min_interval_s: float = 0.0
    carry_over: bool = True

    def __post_init__(self) -> None:
        if self.det_max_side_px < 32:
            raise ConfigError(f"det_max_side_px must be >= 32, got {self.det_max_side_px}")
        if self.min_interval_s < 0:
            raise ConfigError(f"min_interval_s must be >= 0, got {self.min_interval_s}")
        if self.roi is not None:
            x0, y0, x1, y1 = self.roi
            if x1 <= x0 or y1 <= y0:
                raise ConfigError(f"roi must be (x0, y0, x1, y1) with x1>x0, y1>y0; got {self.roi}")


@dataclass(frozen=True, slots=True)
class OcrObservation:
    """What one read cost and found, reported to the policy after every OCR run."""

    stream_id: str
    t_media: float
    #: Wall time of the OCR call itself (detector + recognizer), ms.
    ocr_ms: float
    #: Key frame arrival to the start of the OCR call (queueing, interval wait), ms.
    wait_ms: float
    #: Detector input (width, height) in pixels.
    resolution: tuple[int, int]
    #: Region that was read, original pixels.
    roi: BBox
    n_lines: int
    #: Mean confidence of the kept lines; None when no text was found.
    mean_conf: float | None
    #: Key frames waiting at the OCR input when the read finished.
    backlog: int
    #: Detector pixels per original frame pixel (the frame-level resolution choice).
    scale: float = 1.0


class ResolutionPolicy(ABC):
    """Chooses the OCR plan per key frame; sees feedback after each read."""

    @abstractmethod
    def plan(self, key: KeyFrame) -> OcrPlan:
        """The plan for reading `key`. Called on the event loop: keep it cheap."""

    def observe(self, obs: OcrObservation) -> None:  # noqa: B027 - optional hook
        """Feedback after a read. Default: ignored."""


class FixedResolution(ResolutionPolicy):
    """The same detector resolution and interval for every frame.

    With `content_crop`, only the key frame's content region is read (nothing else can hold
    text); otherwise the whole frame.
    """

    def __init__(
        self, max_side: int = 960, *, min_interval_s: float = 0.0, content_crop: bool = False
    ) -> None:
        self._plan = OcrPlan(det_max_side_px=max_side, min_interval_s=min_interval_s)
        self.content_crop = content_crop

    @classmethod
    def from_config(cls, config: FixedPolicy | None = None) -> FixedResolution:
        """The policy of a `fixed` config variant (the variant's defaults without one)."""
        c = config or FixedPolicy()
        return cls(c.det_max_side_px, min_interval_s=c.min_interval_s, content_crop=c.content_crop)

    def plan(self, key: KeyFrame) -> OcrPlan:
        if self.content_crop and key.content_bbox is not None:
            return replace(self._plan, roi=key.content_bbox, carry_over=False)
        return self._plan

    def __repr__(self) -> str:
        return (
            f"FixedResolution(max_side={self._plan.det_max_side_px}, "
            f"content_crop={self.content_crop})"
        )


__all__ = ["FixedResolution", "OcrObservation", "OcrPlan", "ResolutionPolicy"]
