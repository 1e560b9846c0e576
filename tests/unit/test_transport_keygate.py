"""The edge's key-frame gate: a filmed slide (camera shift, lighting drift, vignetting, sensor
noise, a moving pointer) is not a change; a new line of text or another slide is. Through the
`Edge`, a shaking camera on one slide sends one key frame, not one per detector timeout, and
a key frame the cloud never got is not skipped against."""

from __future__ import annotations

import asyncio

import cv2
import numpy as np
import pytest

from streamfuse.frames import VideoFrame
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.edge import Edge
from streamfuse.transport.keygate import ContentGate
from streamfuse.transport.patches import TextBoxes
from streamfuse.transport.udp import UdpReceiver, UdpSender
from streamfuse.vision.frames import BBox

pytestmark = pytest.mark.unit

W, H = 1280, 720
LINES = ["Why streaming matters", "Users expect answers", "Batch jobs wait", "Latency 300 ms"]


def slide(lines: list[str], pointer: tuple[int, int] | None = None) -> np.ndarray:
    image = np.full((H, W, 3), 235, dtype=np.uint8)
    for i, text in enumerate(lines):
        cv2.putText(image, text, (90, 120 + 90 * i), cv2.FONT_HERSHEY_SIMPLEX, 1.4, (25,) * 3, 3)
        cv2.rectangle(image, (60, 100 + 90 * i), (72, 112 + 90 * i), (60, 90, 200), -1)
    if pointer is not None:
        x, y = pointer
        arrow = np.array([[x, y], [x, y + 22], [x + 6, y + 16], [x + 14, y + 16]], np.int32)
        cv2.fillPoly(image, [arrow], (10, 10, 10))
    return image


def filmed(image: np.ndarray, t: float, seed: int) -> np.ndarray:
    """As the benchmark's camera clip films a screen: perspective, shake, lighting, noise."""
    corners = np.float32([[0, 0], [W, 0], [W, H], [0, H]])
    target = np.float32([[0.08 * W, 0.05 * H], [0.97 * W, 0], [W, H], [0.04 * W, 0.93 * H]])
    shake = np.float32([2 * np.sin(2.1 * t), 2 * np.cos(1.3 * t)])
    m = cv2.getPerspectiveTransform(corners, target + shake)
    warped = cv2.warpPerspective(image, m, (W, H), borderValue=(40, 40, 40))
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    vignette = 1.0 - 0.25 * (((xx - W / 2) / W) ** 2 + ((yy - H / 2) / H) ** 2) * 4
    gain = 0.8 + 0.3 * min(1.0, t / 20.0)
    out = warped.astype(np.float32) * (gain * vignette)[..., None]
    out += np.random.default_rng(seed).normal(0, 4, out.shape)
    return np.clip(out, 0, 255).astype(np.uint8)


def test_shake_lighting_noise_and_a_pointer_are_not_a_change() -> None:
    gate = ContentGate()
    first = filmed(slide(LINES, (900, 500)), 0.0, 1)
    assert gate.changed(first).changed  # nothing sent yet
    gate.accept(first)
    for i, t in enumerate((0.7, 3.1, 9.5, 19.0)):  # up to 2 px shake, gain 0.8 -> 1.1
        later = filmed(slide(LINES, (900 + 40 * i, 500 - 30 * i)), t, 2 + i)
        verdict = gate.changed(later)
        assert not verdict.changed, (t, verdict)
        # The pointer (old and new place) is most of it: about half the threshold.
        assert verdict.changed_frac < 0.75 * gate.min_changed_frac


def test_a_new_line_or_another_slide_is_a_change() -> None:
    gate = ContentGate()
    gate.accept(filmed(slide(LINES), 0.0, 1))
    more = gate.changed(filmed(slide([*LINES, "Every stage keeps up"]), 6.0, 2))
    assert more.changed and more.changed_frac > 2 * gate.min_changed_frac
    other = gate.changed(filmed(slide(["Audio path", "Video path", "20 ms windows"]), 6.0, 3))
    assert other.changed and other.changed_frac > 0.05
    # One line rewritten in place is a change too. (A few characters edited may stay under
    # the threshold: as under the change detector's, whose key frames the gate filters.)
    edited = gate.changed(filmed(slide([*LINES[:3], "Throughput 42 fps"]), 6.0, 4))
    assert edited.changed
    gate.reset()
    assert gate.changed(filmed(slide(LINES), 6.0, 5)).changed


class FixedBoxes(TextBoxes):
    """The text detector's boxes for `slide`, without the model."""

    def __call__(self, image: np.ndarray) -> list[BBox]:
        return [(50, 80 + 90 * i, 700, 135 + 90 * i) for i in range(len(LINES) + 1)]


async def _send(frames: list[np.ndarray], config: TransportConfig, lose_first: bool) -> Edge:
    rx = await UdpReceiver.listen("127.0.0.1", 0, config)
    tx = await UdpSender.connect(*rx.address, config)
    edge = Edge(tx, config, detector=FixedBoxes())
    got: list[int] = []

    async def consume() -> None:
        async for m in rx.messages():
            got.append(m.header.sequence)

    consumer = asyncio.create_task(consume())
    try:
        for i, image in enumerate(frames):
            await edge.video(VideoFrame(image=image, t_media=i / 10, index=i, fps=10))
            if lose_first and edge.report.key_frames == 1:
                # As if the first key frame had missed its deadline: acked never, gone.
                seq = edge.report.sent[0][0]
                tx._out.pop(seq, None)
                tx._acked.discard(seq)
                lose_first = False
        await tx.drain(2.0)
    finally:
        await tx.close()
        await rx.close()
        await consumer
    return edge


def test_the_edge_sends_a_shaking_cameras_slide_once_and_its_next_slide() -> None:
    # 8 s of one filmed slide (the detector fires on shake and lighting: timeouts), then 2 s
    # of another. 10 fps keeps the test light; the detector's timeouts are in seconds.
    one, two = slide(LINES), slide(["Audio path", "Video path", "20 ms windows"])
    frames = [filmed(one if i < 80 else two, i / 10, i % 8) for i in range(100)]
    gated = asyncio.run(_send(frames, TransportConfig(), lose_first=False))
    every = asyncio.run(_send(frames, TransportConfig(key_gate=False), lose_first=False))
    assert every.report.key_frames >= 4  # what a local run reads: shake looks like change
    assert gated.report.key_frames == 2
    assert gated.report.skipped_key_frames == every.report.key_frames - 2
    # The first key frame lost: the next candidate is sent (the cloud holds nothing to show).
    lost = asyncio.run(_send(frames, TransportConfig(), lose_first=True))
    assert lost.report.key_frames == 3
