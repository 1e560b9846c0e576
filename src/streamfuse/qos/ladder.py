"""Resolution ladder: 32-px-aligned OCR input sizes, largest first.

A `Ladder` is an ordered tuple of `Rung`s derived from a maximum size and an aspect ratio. Index
0 is the largest rung; a higher index means less work. `Rung.scale_for(w, h)` is the factor that
fits a frame of that size inside the rung (never upscaling unless asked), which is what an OCR
stage applies before detection.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from streamfuse.errors import ConfigError

ALIGN_PX = 32

# Widths of the default ladder (16:9): 1920x1088 ... 640x352.
DEFAULT_WIDTHS_PX: tuple[int, ...] = (1920, 1600, 1280, 1024, 960, 800, 640)


def align_px(value: float, align: int = ALIGN_PX, *, ties: Literal["down", "even"] = "down") -> int:
    """Round `value` to the nearest multiple of `align`, at least `align`.

    `ties="down"` (default) makes 720 -> 704 and 360 -> 352 (the conventional 16:9 rungs);
    `ties="even"` is Python's `round`, which is how rapidocr sizes its detector input.
    """
    if align <= 0:
        raise ConfigError(f"align must be positive, got {align}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"size must be a positive finite number, got {value}")
    steps = round(value / align) if ties == "even" else math.ceil(value / align - 0.5)
    return max(align, steps * align)


@dataclass(frozen=True, slots=True)
class Rung:
    """One OCR input size, both sides multiples of 32."""

    width_px: int
    height_px: int

    @property
    def long_side_px(self) -> int:
        return max(self.width_px, self.height_px)

    @property
    def pixels(self) -> int:
        return self.width_px * self.height_px

    def scale_for(self, frame_w: int, frame_h: int, *, allow_upscale: bool = False) -> float:
        """Scale factor that fits a `frame_w` x `frame_h` frame inside this rung."""
        if frame_w <= 0 or frame_h <= 0:
            raise ConfigError(f"frame size must be positive, got {frame_w}x{frame_h}")
        scale = min(self.width_px / frame_w, self.height_px / frame_h)
        return scale if allow_upscale else min(1.0, scale)

    def size_for(
        self, frame_w: int, frame_h: int, *, allow_upscale: bool = False
    ) -> tuple[int, int]:
        """(width, height) of the frame after `scale_for`, at least 1 px each side."""
        s = self.scale_for(frame_w, frame_h, allow_upscale=allow_upscale)
        return max(1, round(frame_w * s)), max(1, round(frame_h * s))

    def __str__(self) -> str:
        return f"{self.width_px}x{self.height_px}"


@dataclass(frozen=True, slots=True)
class Ladder:
    """Rungs ordered largest first; index 0 is full resolution."""

    rungs: tuple[Rung, ...]

    def __post_init__(self) -> None:
        if not self.rungs:
            raise ConfigError("a ladder needs at least one rung")
        areas = [r.pixels for r in self.rungs]
        if any(b >= a for a, b in zip(areas, areas[1:], strict=False)):
            raise ConfigError(f"rungs must be strictly decreasing in size, got {self.rungs}")
        for r in self.rungs:
            if r.width_px % ALIGN_PX or r.height_px % ALIGN_PX:
                raise ConfigError(f"rung {r} is not {ALIGN_PX}-px aligned")

    @classmethod
    def from_max(
        cls,
        max_width_px: int = 1920,
        aspect: float = 16 / 9,
        widths_px: Sequence[int] | None = None,
        n_rungs: int = 7,
        min_width_px: int = 640,
    ) -> Ladder:
        """Rungs for `aspect` (width / height).

        With `widths_px`, those widths are used (each aligned); otherwise `n_rungs` widths spaced
        evenly in pixel count between `max_width_px` and `min_width_px`. Heights are
        `align_px(width / aspect)`.
        """
        if aspect <= 0:
            raise ConfigError(f"aspect must be positive, got {aspect}")
        if widths_px is None:
            if max_width_px == 1920 and n_rungs == 7 and min_width_px == 640:
                widths_px = DEFAULT_WIDTHS_PX
            else:
                if n_rungs < 1 or min_width_px > max_width_px:
                    raise ConfigError(
                        f"need n_rungs >= 1 and min_width_px <= max_width_px, got "
                        f"{n_rungs}, {min_width_px}, {max_width_px}"
                    )
                ratio = (min_width_px / max_width_px) if n_rungs > 1 else 1.0
                widths_px = [
                    max_width_px * ratio ** (i / max(1, n_rungs - 1)) for i in range(n_rungs)
                ]
        rungs: list[Rung] = []
        for w in widths_px:
            rung = Rung(align_px(w), align_px(w / aspect))
            if not rungs or rung.pixels < rungs[-1].pixels:
                rungs.append(rung)
        return cls(tuple(rungs))

    def __len__(self) -> int:
        return len(self.rungs)

    def __iter__(self) -> Iterator[Rung]:
        return iter(self.rungs)

    def __getitem__(self, index: int) -> Rung:
        return self.rungs[index]

    @property
    def lowest(self) -> int:
        """Index of the smallest rung."""
        return len(self.rungs) - 1

    def clamp(self, index: int) -> int:
        return min(max(index, 0), self.lowest)

    def nearest(self, width_px: int, height_px: int) -> int:
        """Index of the rung whose pixel count is closest (in log terms) to `width x height`."""
        target = math.log(max(1, width_px * height_px))
        return min(
            range(len(self.rungs)), key=lambda i: abs(math.log(self.rungs[i].pixels) - target)
        )


DEFAULT_LADDER = Ladder.from_max()
