"""Change detector on synthetic frames: what becomes a key frame and what does not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from streamfuse.frames import VideoFrame
from streamfuse.vision import ChangeDetector, ChangeDetectorConfig, ChangeTracker, KeyFrame
from streamfuse.vision.change import thumbnail

pytestmark = pytest.mark.unit

W, H = 1280, 720
FPS = 30.0


def slide(seed: int, *, bg: int = 245) -> np.ndarray:
    """A slide: light background with dark 'text line' bars whose layout depends on `seed`."""
    rng = np.random.default_rng(seed)
    img = np.full((H, W, 3), bg, dtype=np.uint8)
    y = 80
    for _ in range(6):
        x = int(rng.integers(60, 200))
        length = int(rng.integers(300, 900))
        height = int(rng.integers(24, 48))
        # Strokes, not solid boxes: alternate dark glyph columns and gaps like real text.
        for gx in range(x, x + length, 14):
            img[y : y + height, gx : gx + 8] = rng.integers(0, 60, 3, dtype=np.uint8)
        y += height + 40
    return img


def frames(
    images: Callable[[int], np.ndarray], n: int, *, stream_id: str = "main"
) -> list[VideoFrame]:
    return [
        VideoFrame(stream_id=stream_id, t_media=i / FPS, image=images(i), index=i, fps=FPS)
        for i in range(n)
    ]


def keys_of(tracker: ChangeTracker, fs: list[VideoFrame]) -> list[tuple[int, str]]:
    out = []
    for f in fs:
        d = tracker.update(f)
        if d.key:
            assert d.reason is not None
            out.append((f.index, d.reason))
    return out


def test_static_picture_gives_only_the_first_key_frame() -> None:
    img = slide(1)
    assert keys_of(ChangeTracker(), frames(lambda i: img, 90)) == [(0, "first")]


def test_slide_change_gives_one_key_frame_after_settling() -> None:
    a, b = slide(1), slide(2)
    keys = keys_of(ChangeTracker(), frames(lambda i: a if i < 30 else b, 90))
    # settle_s=0.1 at 30 fps: the change at frame 30 is read at frame 33, once.
    assert keys == [(0, "first"), (33, "change")]


def test_transition_is_not_read_half_drawn() -> None:
    a, b = slide(1), slide(2)

    def wipe(i: int) -> np.ndarray:
        # Frames 30..41 wipe b in from the top, 60 px per frame, then b holds still.
        if i < 30:
            return a
        rows = min(H, (i - 29) * 60)
        img = a.copy()
        img[:rows] = b[:rows]
        return img

    keys = keys_of(ChangeTracker(), frames(wipe, 90))
    assert keys[0] == (0, "first")
    assert len(keys) == 2
    index, reason = keys[1]
    assert reason == "change"
    complete = next(i for i in range(30, 90) if np.array_equal(wipe(i), b))
    assert complete > 33  # the wipe really spans several frames
    assert index == complete + 3  # read once, when the wipe is complete and has settled


def test_slow_fade_is_not_read_midway() -> None:
    a, b = slide(1).astype(np.float32), slide(2).astype(np.float32)

    def fade(i: int) -> np.ndarray:
        alpha = min(1.0, max(0.0, (i - 30) / 20))  # 20-frame cross-fade from frame 30
        return ((1 - alpha) * a + alpha * b).round().astype(np.uint8)

    keys = keys_of(ChangeTracker(), frames(fade, 90))
    assert [r for _, r in keys] == ["first", "change"]
    assert keys[1][0] >= 50


def test_moving_mouse_pointer_is_ignored() -> None:
    base = slide(1)

    def pointer(i: int) -> np.ndarray:
        img = base.copy()
        # A 16x24 px pointer wandering over empty space, moving then resting.
        x = 900 + int(200 * np.sin(i / 9)) if i < 60 else 1100
        y = 560 + int(80 * np.cos(i / 7)) if i < 60 else 600
        img[y : y + 24, x : x + 16] = 0
        img[y + 2 : y + 20, x + 2 : x + 10] = 255
        return img

    assert keys_of(ChangeTracker(), frames(pointer, 120)) == [(0, "first")]


def test_gradual_noise_and_brightness_drift_are_ignored() -> None:
    base = slide(3).astype(np.float32)
    rng = np.random.default_rng(7)
    unit_noise = [rng.standard_normal(base.shape, dtype=np.float32) for _ in range(4)]

    def noisy(i: int) -> np.ndarray:
        sigma = 12.0 * i / 60  # noise grows from 0 to sigma 12
        drift = 25.0 * i / 60  # exposure creeps up by 25 grey levels
        img = base + drift + sigma * unit_noise[i % 4]
        return np.clip(img, 0, 255).astype(np.uint8)

    assert keys_of(ChangeTracker(), frames(noisy, 61)) == [(0, "first")]


def test_picture_that_never_settles_is_read_after_max_wait() -> None:
    a = slide(1)
    cfg = ChangeDetectorConfig(max_wait_s=1.0)

    def moving(i: int) -> np.ndarray:
        if i < 30:
            return a
        img = a.copy()
        # A large animated region (a video inside the slide) that changes every frame.
        x = 300 + (i % 2) * 300
        img[200:500, x : x + 300] = (i * 37) % 255
        return img

    keys = keys_of(ChangeTracker(cfg), frames(moving, 120))
    assert keys[0] == (0, "first")
    assert keys[1][1] == "timeout"
    assert 30 + 29 <= keys[1][0] <= 30 + 31  # ~1.0 s after the change first appeared


def test_bbox_covers_the_changed_region_only() -> None:
    a = slide(1)
    b = a.copy()
    b[500:560, 700:1100] = 20  # a new line of 'text' bottom right
    tracker = ChangeTracker()
    decisions = [tracker.update(f) for f in frames(lambda i: a if i < 10 else b, 20)]
    key = next(d for d in decisions[1:] if d.key)
    x0, y0, x1, y1 = key.bbox
    assert x0 <= 700 and y0 <= 500 and x1 >= 1100 and y1 >= 560
    # Padded by one cell (8 px at 720p) plus rounding, no more.
    assert x0 >= 700 - 24 and y0 >= 500 - 24 and x1 <= 1100 + 24 and y1 <= 560 + 24
    assert key.t_changed == pytest.approx(10 / FPS)


def test_returning_to_the_read_picture_cancels_the_pending_change() -> None:
    a, b = slide(1), slide(2)
    # b flashes for one frame only: never settles, then the read picture is back.
    keys = keys_of(ChangeTracker(), frames(lambda i: b if i == 30 else a, 90))
    assert keys == [(0, "first")]


def test_streams_and_picture_sizes_are_tracked_separately() -> None:
    a = slide(1)
    small = a[::2, ::2].copy()
    tracker = ChangeTracker()
    fa = frames(lambda i: a, 10, stream_id="cam1")
    fb = frames(lambda i: a, 10, stream_id="cam2")
    interleaved = [f for pair in zip(fa, fb, strict=True) for f in pair]
    first = [(f.stream_id, f.index) for f in interleaved if tracker.update(f).key]
    assert first == [("cam1", 0), ("cam2", 0)]
    resized = VideoFrame(stream_id="cam1", t_media=1.0, image=small, index=30, fps=FPS)
    d = tracker.update(resized)
    assert d.key and d.reason == "first"


def test_thumbnail_is_small_grey_and_resolution_independent() -> None:
    img = slide(4)
    t720 = thumbnail(img, 160)
    t1080 = thumbnail(np.repeat(np.repeat(img, 3, axis=0), 3, axis=1)[::2, ::2], 160)
    assert t720.shape == (90, 160) and t720.dtype == np.int16
    assert t1080.shape == (90, 160)
    assert float(np.abs(t720 - t1080).mean()) < 6.0


def test_stage_emits_key_frames_with_the_video_frames_timing() -> None:
    a, b = slide(1), slide(2)
    fs = frames(lambda i: a if i < 30 else b, 60)
    stage = ChangeDetector()

    async def drive() -> list[KeyFrame]:
        out = []
        for f in fs:
            async for k in stage.process(f):
                assert isinstance(k, KeyFrame)
                out.append(k)
        async for k in stage.flush():
            assert isinstance(k, KeyFrame)
            out.append(k)
        return out

    keys = asyncio.run(drive())
    assert [k.index for k in keys] == [0, 33]
    k = keys[1]
    src = fs[33]
    assert k.arrival_wall == src.arrival_wall and k.t_media == src.t_media
    assert k.image is src.image and k.size == (W, H)
    assert not isinstance(k, VideoFrame)
    assert k.reason == "change" and 0.0 < k.changed_frac <= 1.0


def test_flush_emits_a_change_that_had_no_time_to_settle() -> None:
    a, b = slide(1), slide(2)
    fs = frames(lambda i: a if i < 29 else b, 30)  # b appears on the very last frame
    stage = ChangeDetector()

    async def drive() -> list[KeyFrame]:
        out = []
        for f in fs:
            out += [k async for k in stage.process(f) if isinstance(k, KeyFrame)]
        out += [k async for k in stage.flush() if isinstance(k, KeyFrame)]
        return out

    keys = asyncio.run(drive())
    assert [(k.index, k.reason) for k in keys] == [(0, "first"), (29, "end")]


def test_config_bounds_are_enforced() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        ChangeDetectorConfig(min_changed_frac=1.5)
    with pytest.raises(ValidationError):
        ChangeDetectorConfig(settle_s=-0.1)
    with pytest.raises(ValidationError):
        ChangeDetectorConfig(unknown_field=1)  # type: ignore[call-arg]


def test_key_frames_carry_the_content_region() -> None:
    img = np.full((H, W, 3), 30, dtype=np.uint8)  # a dark slide
    img[200:260, 300:900] = 220  # light 'text' block
    img[400:430, 300:500] = 200
    d = ChangeTracker().update(VideoFrame(t_media=0.0, image=img, index=0, fps=FPS))
    assert d.key and d.content_bbox is not None
    x0, y0, x1, y1 = d.content_bbox
    assert x0 <= 300 and y0 <= 200 and x1 >= 900 and y1 >= 430
    assert x0 >= 300 - 32 and y0 >= 200 - 32 and x1 <= 900 + 32 and y1 <= 430 + 32
    blank = np.full((H, W, 3), 128, dtype=np.uint8)
    d = ChangeTracker().update(VideoFrame(t_media=0.0, image=blank, index=0, fps=FPS))
    assert d.key and d.content_bbox is None
