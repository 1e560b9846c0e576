"""Frame -> model input for the resolution head; one function shared by training and runtime.

A frame (RGB or grey uint8) becomes a grey thumbnail of `input_hw` (box filter; the aspect ratio
is not kept, the model is trained on 16:9 frames), is standardized per image (zero mean, unit
standard deviation with a floor, so light and dark slides look alike), and is rearranged
space-to-depth in 4x4 blocks: (h, w) -> (16, h/4, w/4), channel = 4 * row offset + column
offset (the order of `torch.nn.functional.pixel_unshuffle`).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from streamfuse.errors import ConfigError

DEFAULT_INPUT_HW = (144, 256)
BLOCK = 4
_STD_FLOOR = 0.02


def grey_thumbnail(image: np.ndarray, input_hw: tuple[int, int] = DEFAULT_INPUT_HW) -> np.ndarray:
    """(H, W, 3) RGB or (H, W) grey uint8 -> (h, w) grey uint8 thumbnail."""
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise ConfigError(
            f"expected a uint8 (H, W) or (H, W, 3) frame, got {image.dtype} {image.shape}"
        )
    pil = Image.fromarray(image)
    if pil.mode != "L":
        pil = pil.convert("L")
    return np.asarray(pil.resize((input_hw[1], input_hw[0]), Image.Resampling.BOX))


def standardize(thumbs: np.ndarray) -> np.ndarray:
    """uint8 thumbnails (..., h, w) -> float32, each standardized over its own pixels."""
    x = thumbs.astype(np.float32) / 255.0
    mean = x.mean(axis=(-2, -1), keepdims=True)
    std = x.std(axis=(-2, -1), keepdims=True)
    return (x - mean) / np.maximum(std, _STD_FLOOR)


def space_to_depth(x: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """(N, h, w) -> (N, block^2, h/block, w/block)."""
    n, h, w = x.shape
    if h % block or w % block:
        raise ConfigError(f"thumbnail {h}x{w} is not a multiple of {block}")
    y = x.reshape(n, h // block, block, w // block, block).transpose(0, 2, 4, 1, 3)
    return np.ascontiguousarray(y.reshape(n, block * block, h // block, w // block))


def model_input(thumbs: np.ndarray) -> np.ndarray:
    """uint8 thumbnails (N, h, w) -> float32 model input (N, 16, h/4, w/4)."""
    return space_to_depth(standardize(thumbs))


def to_input(image: np.ndarray, input_hw: tuple[int, int] = DEFAULT_INPUT_HW) -> np.ndarray:
    """One frame -> (1, 16, h/4, w/4) float32 model input."""
    return model_input(grey_thumbnail(image, input_hw)[None])
