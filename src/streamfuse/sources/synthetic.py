"""A synthetic source for tests and demos without media files.

Produces slides (flat colour blocks whose pattern changes every `slide_s`) at `fps` and a tone
(plus optional noise) in 20 ms audio windows, interleaved in media-time order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np

from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ, AudioFrame, Frame, VideoFrame
from streamfuse.pipeline.source import Pacer, Source


class SyntheticSource(Source):
    def __init__(
        self,
        duration_s: float = 5.0,
        *,
        stream_id: str = "main",
        fps: float = 30.0,
        size: tuple[int, int] = (320, 180),
        slide_s: float = 1.0,
        sample_rate: int = AUDIO_SAMPLE_RATE_HZ,
        window_ms: float = 20.0,
        video: bool = True,
        audio: bool = True,
        realtime: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(name="synthetic", stream_id=stream_id)
        self.duration_s = duration_s
        self.fps = fps
        self.size = size
        self.slide_s = slide_s
        self.sample_rate = sample_rate
        self.window = round(sample_rate * window_ms / 1000.0)
        self.video = video
        self.audio = audio
        self.pacer = Pacer(realtime)
        self._rng = np.random.default_rng(seed)

    def _slide(self, k: int) -> np.ndarray:
        w, h = self.size
        img = np.full((h, w, 3), 255, dtype=np.uint8)
        rng = np.random.default_rng(k)
        for _ in range(3):
            x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
            img[y0 : y0 + h // 4, x0 : x0 + w // 3] = rng.integers(0, 200, 3, dtype=np.uint8)
        return img

    async def frames(self) -> AsyncIterator[Frame]:
        duration = float(self.duration_s or 0.0)
        n_video = int(duration * self.fps) if self.video else 0
        n_audio = int(duration * self.sample_rate / self.window) if self.audio else 0
        vi = ai = 0
        while vi < n_video or ai < n_audio:
            tv = vi / self.fps if vi < n_video else float("inf")
            ta = ai * self.window / self.sample_rate if ai < n_audio else float("inf")
            if tv <= ta:
                wall = await self.pacer.wait_until(tv)
                yield VideoFrame(
                    stream_id=self.stream_id,
                    t_media=tv,
                    arrival_wall=wall,
                    image=self._slide(int(tv // self.slide_s)),
                    index=vi,
                    fps=self.fps,
                )
                vi += 1
            else:
                wall = await self.pacer.wait_until(ta)
                t = ta + np.arange(self.window) / self.sample_rate
                tone = 0.3 * np.sin(2 * np.pi * 440.0 * t)
                noise = 0.01 * self._rng.standard_normal(self.window)
                yield AudioFrame(
                    stream_id=self.stream_id,
                    t_media=ta,
                    arrival_wall=wall,
                    samples=(tone + noise).astype(np.float32),
                    sample_rate=self.sample_rate,
                    index=ai,
                )
                ai += 1
