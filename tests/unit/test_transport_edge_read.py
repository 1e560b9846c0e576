"""The edge-read split: the edge reads a key frame's text itself when its link cannot carry the
pixels by the deadline and its recognizer can deliver the lines in time (`EdgeReadPolicy`,
from measured quantities); the lines cross the wire as a TEXT_LINES message (codec: decode or
`WireError`, whatever the bytes); the cloud's OCR stage emits them as `ocr` events marked
`read_by` edge, and a later read of the same frame's pixels replaces them only if surer; a
malformed message is counted and dropped, and the receive loop goes on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamfuse.frames import ErrorFrame, EventFrame, Frame
from streamfuse.testing import run_stage
from streamfuse.testing.netfault import FaultConfig, FaultProxy
from streamfuse.transport.cloud import CloudSource
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.edge import Edge, EdgeReport
from streamfuse.transport.fuzz import fuzz_text_lines
from streamfuse.transport.patches import TextBoxes
from streamfuse.transport.policy import DeadlineKeepPolicy, EdgeReadPolicy
from streamfuse.transport.textlines import (
    MAX_BODY_BYTES,
    EdgeReading,
    decode_text_lines,
    encode_text_lines,
    rec_width_px,
)
from streamfuse.transport.udp import LinkEstimate, UdpReceiver, UdpSender
from streamfuse.transport.wire import Kind, Modality, Packet, WireError
from streamfuse.vision import KeyFrame, OcrEngine, OcrLine, OcrReading, OcrStage

pytestmark = pytest.mark.unit

#: 200 kbit/s, 80 ms path, nothing queued: the deadline policy's budget is ~24.8 KB.
SLOW = LinkEstimate(0.08, 0.3, 0.0, 200_000, 0, 0.08)
FAST = LinkEstimate(0.02, 0.2, 0.0, 20_000_000, 0, 0.02)
PAGE_BOXES = [(50, 30 + 34 * i, 1850, 54 + 34 * i) for i in range(30)]  # 30 lines of text


def budget(link: LinkEstimate) -> float | None:
    return DeadlineKeepPolicy(1.5, 0.05).budget_bytes(link)


def test_the_split_moves_to_the_edge_only_when_the_pixels_cannot_arrive_and_the_read_can() -> None:
    width = rec_width_px(PAGE_BOXES)  # 30 lines of 1800 x 24 px: 108,000 recognizer px
    assert width == pytest.approx(30 * 48 * 1800 / 24)
    split = EdgeReadPolicy(1.5, prior_s_per_px=5e-6)  # 0.54 s for the page
    b = budget(SLOW)
    assert b is not None and 24_000 < b < 25_500
    # 40 KB of pixels do not fit 200 kbit/s by the deadline; the read and 2.4 KB of text do.
    d = split.decide(SLOW, b, 40_000, width, 30, now=100.0)
    assert d.edge_read and d.reason == "edge read"
    assert d.patch_s == pytest.approx(1.6) and d.read_s == pytest.approx(0.54)
    # Pixels that fit stay pixels: today's split.
    assert not split.decide(SLOW, b, 20_000, width, 30, now=100.0).edge_read
    # A good link carries the same 40 KB: never read at the edge there.
    fast = split.decide(FAST, budget(FAST), 40_000, width, 30, now=100.0)
    assert not fast.edge_read and fast.reason == "pixels fit"
    # Nothing measured of the link or of the recognizer: pixels.
    unmeasured = LinkEstimate(None, 1.0, 0.0, None, 0, None)
    assert not split.decide(unmeasured, None, 40_000, width, 30, 100.0).edge_read
    assert not EdgeReadPolicy(1.5).decide(SLOW, b, 40_000, width, 30, 100.0).edge_read
    # A recognizer too slow for the deadline (10 s for the page, as measured on a loaded
    # 2-core box): the pixels go coarser instead.
    slow_reader = EdgeReadPolicy(1.5, prior_s_per_px=1e-4)
    d = slow_reader.decide(SLOW, b, 40_000, width, 30, now=100.0)
    assert not d.edge_read and d.reason == "read too slow"
    # The bytes already queued ahead delay the text too.
    queued = LinkEstimate(0.08, 0.3, 0.0, 200_000, 15_000, 0.08)  # 0.6 s of the link
    assert split.decide(queued, budget(queued), 40_000, width, 30, 100.0).reason == (
        "read too slow"
    )


def test_the_split_follows_the_measured_read_cost_and_the_edges_busy_share() -> None:
    split = EdgeReadPolicy(1.5, prior_s_per_px=5e-6, window_s=10.0, max_busy=0.8)
    b = budget(SLOW)
    width = rec_width_px(PAGE_BOXES)
    # Reads measured slower than the prior: the EWMA follows, and the page no longer fits.
    split.observe_read(width, 1.5)
    split.observe_read(width, 1.5)
    assert split.cost_s_per_px == pytest.approx(0.75 * 1.5 / width + 0.25 * 5e-6)
    assert split.decide(SLOW, b, 40_000, width, 30, 100.0).reason == "read too slow"
    fresh = EdgeReadPolicy(1.5, prior_s_per_px=5e-6, window_s=10.0, max_busy=0.8)
    # 7.8 s of the last 10 s busy: the 0.54 s read would push the edge behind real time.
    fresh.observe_work(7.8, now=99.0)
    d = fresh.decide(SLOW, b, 40_000, width, 30, now=100.0)
    assert not d.edge_read and d.reason == "edge busy" and d.busy == pytest.approx(0.78)
    # That work is older than the window 12 s later: the edge has room again.
    assert fresh.decide(SLOW, b, 40_000, width, 30, now=112.0).edge_read


def page_key(index: int = 7, t: float = 4.5) -> KeyFrame:
    return KeyFrame(
        stream_id="doc",
        t_media=t,
        image=np.zeros((1080, 1920, 3), dtype=np.uint8),
        index=index,
        changed_bbox=(0, 0, 1920, 1080),
        t_changed=t - 0.2,
        reason="change",
    )


LINES = (
    ("node cluster memory", (50.0, 30.0, 600.0, 54.0), 0.97),
    ("latency budget", (50.0, 64.0, 420.0, 88.0), 0.91),
)


def test_text_lines_cross_the_codec_with_their_key_frame() -> None:
    payload = encode_text_lines(page_key(), LINES, read_ms=812.34, det_side_px=960)
    assert len(payload) < 200  # a few hundred bytes where the pixels take tens of KB
    key = decode_text_lines(payload, stream_id="doc", arrival_wall=12.0)
    assert key.read_lines == LINES
    assert (key.index, key.t_media, key.t_changed, key.reason) == (7, 4.5, 4.3, "change")
    assert key.size == (1920, 1080) and key.changed_bbox == (0, 0, 1920, 1080)
    assert key.read_ms == 812.3 and key.read_det_side_px == 960 and key.arrival_wall == 12.0
    assert key.image.strides == (0, 0, 0)  # no pixels: a zero-stride blank page


def body(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "i": 1,
        "t": 0.5,
        "w": 64,
        "h": 32,
        "tc": 0.4,
        "r": "change",
        "ch": [0, 0, 64, 32],
        "ms": 3.0,
        "det": 960,
        "l": [["ab", [0, 0, 10, 10], 0.9]],
    }
    base.update(over)
    return base


@pytest.mark.parametrize(
    "bad",
    [
        body(w=0),
        body(w="64"),
        body(i=-1),
        body(t=float("nan")) | {"t": "nan"},
        body(ms=-1.0),
        body(r="because"),
        body(ch=[0, 0, 65, 32]),
        body(l=[["ab", [0, 0, 10, 40], 0.9]]),  # box outside the frame
        body(l=[["ab", [0, 0, 10], 0.9]]),
        body(l=[["ab", [0, 0, 10, 10], 1.5]]),
        body(l=[[3, [0, 0, 10, 10], 0.9]]),
        body(l=[["ab", [0, 0, 10, 10], True]]),
        body(l="ab"),
        [1, 2, 3],
        "text",
    ],
)
def test_malformed_text_line_bodies_are_wire_errors(bad: Any) -> None:
    payload = zlib.compress(json.dumps(bad).encode())
    with pytest.raises(WireError):
        decode_text_lines(payload, stream_id="s", arrival_wall=0.0)


def test_truncated_trailing_and_inflating_payloads_are_wire_errors() -> None:
    good = zlib.compress(json.dumps(body()).encode())
    decode_text_lines(good, stream_id="s", arrival_wall=0.0)
    for bad in (good[:-3], good + b"x", b"", zlib.compress(b"\xff\xfe"), b"not deflate"):
        with pytest.raises(WireError):
            decode_text_lines(bad, stream_id="s", arrival_wall=0.0)
    bomb = zlib.compress(b" " * (MAX_BODY_BYTES + 10) + json.dumps(body()).encode(), 9)
    assert len(bomb) < 5_000
    with pytest.raises(WireError, match="inflate past"):
        decode_text_lines(bomb, stream_id="s", arrival_wall=0.0)


@given(st.binary(max_size=600))
def test_arbitrary_bytes_decode_or_raise_wire_error(data: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_text_lines(data, stream_id="s", arrival_wall=0.0)


@given(st.data())
def test_mutated_text_line_payloads_decode_or_raise_wire_error(data: st.DataObject) -> None:
    payload = bytearray(encode_text_lines(page_key(), LINES, read_ms=5.0, det_side_px=960))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(payload) - 1))
        payload[i] ^= 1 << data.draw(st.integers(0, 7))
    with contextlib.suppress(WireError):
        decode_text_lines(bytes(payload), stream_id="s", arrival_wall=0.0)


def test_text_line_fuzz_never_crashes() -> None:
    result = fuzz_text_lines(3_000, seed=5)
    assert result.crashes == 0, result.examples
    assert result.packets > 0 and result.wire_errors > 0


class NoEngine(OcrEngine):
    """Counts reads; reads `lines` (conf `conf`) when asked."""

    def __init__(self, lines: list[OcrLine]) -> None:
        self.lines = lines
        self.reads = 0

    def read(self, image: np.ndarray, det_max_side_px: int) -> OcrReading:
        self.reads += 1
        return OcrReading(tuple(self.lines), (960, 540), 10.0)


def events_of(frames: list[Frame]) -> list[dict[str, Any]]:
    return [f.payload.fields() for f in frames if isinstance(f, EventFrame)]


def test_edge_read_lines_become_ocr_events_and_a_later_read_replaces_them_only_if_surer() -> None:
    edge_key = decode_text_lines(
        encode_text_lines(page_key(), LINES, read_ms=800.0, det_side_px=960),
        stream_id="doc",
        arrival_wall=10.0,
    )
    # The refinement's pixels of the same frame, read here less surely and differently.
    unsure = [OcrLine("n0de clustor memory", (50, 30, 600, 54), 0.6)]
    engine = NoEngine(unsure)
    out = asyncio.run(run_stage(OcrStage(engine=engine), [edge_key, page_key()]))
    events = events_of(out)
    assert len(events) == 1 and engine.reads >= 1  # read (and its unsure line re-read)
    first = events[0]
    assert first["read_by"] == "edge" and first["text"] == "node cluster memory\nlatency budget"
    assert first["frame_index"] == 7 and first["ocr_ms"] == 800.0
    assert first["resolution"] == [960, 544] and first["scale"] == 0.5  # the edge's detector
    # Surer than the edge: replaces it. A new frame after the edge's: read as ever.
    sure = [OcrLine("node cluster memory now", (50, 30, 600, 54), 0.995)]
    out = asyncio.run(run_stage(OcrStage(engine=NoEngine(sure)), [edge_key, page_key()]))
    assert [e["read_by"] for e in events_of(out)] == ["edge", None]
    out = asyncio.run(
        run_stage(OcrStage(engine=NoEngine(unsure)), [edge_key, page_key(index=9, t=8.0)])
    )
    assert [(e["read_by"], e["frame_index"]) for e in events_of(out)] == [("edge", 7), (None, 9)]


def test_the_cloud_turns_edge_text_into_key_frames_and_counts_malformed_ones() -> None:
    async def run() -> tuple[list[Frame], int, int]:
        config = TransportConfig()
        rx = await UdpReceiver.listen("127.0.0.1", 0, config)
        tx = await UdpSender.connect(*rx.address, config)
        source = CloudSource(rx, idle_timeout_s=5.0)
        control = Packet(kind=Kind.CONTROL, modality=Modality.JSON)
        opening = {"op": "open", "stream_id": "doc", "video": True, "audio": False}
        await tx.send_reliable(control, json.dumps(opening).encode(), 5)
        await source.open()
        text = Packet(modality=Modality.TEXT_LINES, media_time_us=4_500_000)
        tx.send(text, zlib.compress(b'{"i": "seven"}'))  # malformed: counted, dropped
        tx.send(text, b"\x00garbage")
        tx.send(text, encode_text_lines(page_key(), LINES, read_ms=5.0, det_side_px=960))
        await tx.send_reliable(control, b'{"op": "end"}', 5)
        frames = [f async for f in source.frames()]
        await tx.close()
        await source.close()
        return frames, source.undecodable, source.text_messages

    frames, undecodable, texts = asyncio.run(run())
    assert undecodable == 2 and texts == 3
    errors = [f for f in frames if isinstance(f, ErrorFrame)]
    keys = [f for f in frames if isinstance(f, KeyFrame)]
    assert len(errors) == 2 and all("dropped" in e.message for e in errors)
    assert len(keys) == 1 and keys[0].read_lines == LINES and keys[0].stream_id == "doc"
    # ... and the OCR stage downstream emits them as the cloud's `ocr` event.
    out = asyncio.run(run_stage(OcrStage(engine=NoEngine([])), keys))
    assert [e["read_by"] for e in events_of(out)] == ["edge"]


class FixedRegions(TextBoxes):
    """A detector that finds the given boxes (as axis-aligned quadrilaterals)."""

    def __init__(self, boxes: list[tuple[int, int, int, int]]) -> None:
        super().__init__()
        self.boxes = boxes

    def regions(self, image: np.ndarray) -> list[tuple[Any, np.ndarray]]:
        return [
            (b, np.array([[b[0], b[1]], [b[2], b[1]], [b[2], b[3]], [b[0], b[3]]], np.float32))
            for b in self.boxes
        ]


class InstantReader:
    """The edge's recognizer at a toy size: reads every box as "line k"."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, image: np.ndarray, boxes: Any, quads: Any = None) -> EdgeReading:
        self.calls += 1
        lines = tuple((f"line {k}", tuple(float(v) for v in b), 0.95) for k, b in enumerate(boxes))
        return EdgeReading(lines, 0.01, 0.01)  # type: ignore[arg-type]


def noisy_page(lines: int) -> tuple[KeyFrame, list[tuple[int, int, int, int]]]:
    rng = np.random.default_rng(3)
    image = np.full((720, 1280), 225.0)
    boxes = []
    for k in range(lines):
        y0 = 20 + 34 * k
        boxes.append((20, y0, 1260, y0 + 22))
        for x in range(24, 1250, 9):
            image[y0 + rng.integers(0, 12) : y0 + 10 + rng.integers(0, 12), x : x + 3] = 30
    image += rng.normal(0, 4, image.shape)
    rgb = np.repeat(np.clip(image, 0, 255).astype(np.uint8)[..., None], 3, axis=2)
    return KeyFrame(stream_id="s", t_media=1.0, image=rgb, index=lines, reason="change"), boxes


def test_the_edge_sends_text_for_a_frame_its_link_cannot_carry_and_pixels_otherwise() -> None:
    config = TransportConfig(deadline_s=0.6, key_gate=False, refine=False)
    dense, dense_boxes = noisy_page(20)
    sparse, sparse_boxes = noisy_page(1)

    async def run() -> tuple[list[Modality], EdgeReport, int]:
        rx = await UdpReceiver.listen("127.0.0.1", 0, config)
        proxy = FaultProxy(rx.address, FaultConfig(bandwidth_bps=200_000, delay_ms=20))
        tx = await UdpSender.connect(*await proxy.start(), config)
        got: list[Modality] = []

        async def consume() -> None:
            async for m in rx.messages():
                got.append(m.header.modality)

        consumer = asyncio.create_task(consume())
        await tx.send_reliable(Packet(kind=Kind.CONTROL, modality=Modality.JSON), b"{}", 5)
        reader = InstantReader()
        for key, boxes in ((dense, dense_boxes), (sparse, sparse_boxes)):
            edge = Edge(tx, config, detector=FixedRegions(boxes))
            edge.reader = reader  # type: ignore[assignment]
            edge.split.cost_s_per_px = 1e-7  # a fast recognizer, as measured at start
            edge.opened({"stream_id": "s"})
            await edge.key_frame(key)
            await tx.drain(2.0)
            report = edge.report
        await rx.close()
        await consumer
        await tx.close()
        await proxy.close()
        return got, report, reader.calls

    got, last, reads = asyncio.run(run())
    # The dense page went as its lines (read once at the edge), the sparse one as pixels.
    assert reads == 1
    assert [m for m in got if m in (Modality.TEXT_LINES, Modality.VIDEO_PATCHES)] == [
        Modality.TEXT_LINES,
        Modality.VIDEO_PATCHES,
    ]
    assert last.edge_read_frames == 0 and last.split_decisions == []  # pixels fit: no check
