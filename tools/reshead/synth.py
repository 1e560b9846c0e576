"""Slide-like frame generator with ground-truth text, for training and testing the resolution head.

`make_slide(rng)` renders a 1920x1080 (by default) RGB slide with Pillow: light or dark
background, optional bars/panels, a title and 1-6 body lines in a random system font, with the
smallest text height drawn log-uniformly from 14-72 px. The returned `Slide` carries the exact
lines drawn, so OCR output can be scored against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from streamfuse.errors import ConfigError

FONT_DIRS = (Path("/usr/share/fonts"), Path("/usr/local/share/fonts"))

# Fonts whose glyphs are not Latin text (math, symbols) would make unreadable "ground truth".
_SKIP_FONT_WORDS = ("math", "symbol", "emoji", "dingbat", "extralight", "oblique", "italic")

_WORDS = (  # noqa: SIM905 - a word list reads better as text
    "the model stream frame latency budget video audio speech text slide lecture meeting "
    "network edge cloud token cache memory queue stage sensor camera signal power energy "
    "quality accuracy result system design method data train test value error score "
    "time rate scale image region focus detect recognize transcript summary agenda review "
    "project release plan goal risk cost market sales growth revenue customer product team "
    "research analysis report figure table chart trend forecast baseline target metric "
    "python engine pipeline adaptive resolution control feedback policy window buffer "
    "alignment fusion attention encoder decoder layer weight gradient batch epoch "
    "introduction overview background motivation conclusion questions thanks next steps "
    "first second third phase version update status open closed north south east west"
).split()


@dataclass(frozen=True, slots=True)
class Slide:
    """A rendered slide: RGB uint8 image, the lines drawn (reading order), smallest text px."""

    image: np.ndarray
    lines: tuple[str, ...]
    min_text_px: int
    dark: bool

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@lru_cache(maxsize=1)
def system_fonts() -> tuple[Path, ...]:
    """Latin TrueType/OpenType fonts found under the system font folders, sorted."""
    found: list[Path] = []
    for root in FONT_DIRS:
        if root.is_dir():
            for ext in ("*.ttf", "*.otf"):
                found.extend(root.rglob(ext))
    fonts = tuple(
        sorted(p for p in found if not any(w in p.name.lower() for w in _SKIP_FONT_WORDS))
    )
    if not fonts:
        raise ConfigError(
            f"no fonts under {[str(d) for d in FONT_DIRS]}; install fonts-dejavu or "
            "fonts-liberation"
        )
    return fonts


@lru_cache(maxsize=512)
def _font(path: Path, size_px: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(path), size_px)


def _phrase(rng: np.random.Generator, n_words: int) -> str:
    words = [str(_WORDS[int(i)]) for i in rng.integers(0, len(_WORDS), n_words)]
    if rng.random() < 0.3:
        words.insert(int(rng.integers(0, len(words) + 1)), str(int(rng.integers(1, 2000))))
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    return " ".join(words)


def _fit(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.FreeTypeFont, max_w: int) -> str:
    """Drop trailing words until `text` fits `max_w` pixels (keeps at least one word)."""
    words = text.split()
    while len(words) > 1 and draw.textlength(" ".join(words), font=font) > max_w:
        words.pop()
    return " ".join(words)


def make_slide(
    rng: np.random.Generator,
    width_px: int = 1920,
    height_px: int = 1080,
    min_text_px: tuple[int, int] = (14, 72),
) -> Slide:
    """Render one random slide. Deterministic for a given `rng` state and font set."""
    lo, hi = min_text_px
    if not 4 <= lo <= hi:
        raise ConfigError(f"min_text_px must be (lo, hi) with 4 <= lo <= hi, got {min_text_px}")
    fonts = system_fonts()
    dark = bool(rng.random() < 0.35)
    base = rng.integers(0, 45, 3) if dark else rng.integers(215, 256, 3)
    img = Image.new("RGB", (width_px, height_px), tuple(int(c) for c in base))
    draw = ImageDraw.Draw(img)

    # Decorations: a header bar and/or a side panel in a muted colour.
    if rng.random() < 0.5:
        bar_h = int(rng.integers(height_px // 40, height_px // 12))
        colour = tuple(int(c) for c in rng.integers(60, 200, 3))
        draw.rectangle([0, 0, width_px, bar_h], fill=colour)
    if rng.random() < 0.3:
        x0 = int(rng.integers(width_px // 2, width_px - width_px // 8))
        shade = tuple(int(np.clip(c + rng.integers(-25, 26), 0, 255)) for c in base)
        draw.rectangle([x0, height_px // 6, width_px, height_px], fill=shade)

    ink_lo, ink_hi = (200, 256) if dark else (0, 70)
    ink = tuple(int(c) for c in rng.integers(ink_lo, ink_hi, 3))
    font_path = fonts[int(rng.integers(0, len(fonts)))]

    body_px = round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    title_px = min(int(body_px * rng.uniform(1.2, 1.8)), max(body_px, 96))
    has_title = bool(rng.random() < 0.8)
    n_body = int(rng.integers(1, 7))
    margin = int(width_px * rng.uniform(0.04, 0.12))
    centered = bool(rng.random() < 0.25)
    max_w = width_px - 2 * margin

    lines: list[str] = []
    y = int(height_px * rng.uniform(0.06, 0.2))
    specs = ([(title_px, 2, 4)] if has_title else []) + [(body_px, 2, 8)] * n_body
    for size_px, w_lo, w_hi in specs:
        font = _font(font_path, size_px)
        line_h = int(size_px * rng.uniform(1.4, 2.0))
        if y + line_h > height_px - height_px // 20:
            break
        text = _fit(draw, _phrase(rng, int(rng.integers(w_lo, w_hi))), font, max_w)
        prefix = "- " if size_px == body_px and rng.random() < 0.3 else ""
        text = _fit(draw, prefix + text, font, max_w)
        x = (width_px - int(draw.textlength(text, font=font))) // 2 if centered else margin
        draw.text((x, y), text, font=font, fill=ink)
        lines.append(text)
        y += line_h
    if len(lines) == 0 or (has_title and len(lines) == 1 and n_body > 0):
        # Always keep at least one body line so the smallest size is on the slide.
        font = _font(font_path, body_px)
        text = _fit(draw, _phrase(rng, 3), font, max_w)
        y = min(y, height_px - int(body_px * 1.5))
        draw.text((margin, y), text, font=font, fill=ink)
        lines.append(text)
    return Slide(np.asarray(img), tuple(lines), body_px, dark)
