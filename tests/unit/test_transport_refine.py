"""A key frame sent coarser is refined after it: the finest coding, band by band, each part
copying the rest from the cloud's copy (`transport.refine`, `encode_patches(band=...)`); the
deadline policy's ladder keeps a noisy frame's own coding at fewer grey levels."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import numpy as np
import pytest

from streamfuse.testing.netfault import FaultConfig, FaultProxy
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.edge import held_reference
from streamfuse.transport.patches import (
    PatchMessage,
    Reference,
    decode_patches,
    encode_patches,
)
from streamfuse.transport.policy import DeadlineKeepPolicy
from streamfuse.transport.refine import Refiner, refine_config
from streamfuse.transport.udp import LinkEstimate, RttEstimator, UdpReceiver, UdpSender
from streamfuse.transport.wire import Kind, Modality, Packet, WireError
from streamfuse.vision.frames import KeyFrame

pytestmark = pytest.mark.unit


def _filmed_page() -> tuple[KeyFrame, list[tuple[int, int, int, int]]]:
    """A 640x360 page of six 24 px lines of random 'glyphs' (3 px strokes) under sensor
    noise (sigma 4): a noisy frame, coded at `noisy_grey_levels`."""
    rng = np.random.default_rng(11)
    image = np.full((360, 640), 225.0)
    boxes = []
    for line in range(6):
        y0 = 30 + line * 52
        boxes.append((30, y0, 610, y0 + 24))
        for x in range(34, 590, 10):
            for _ in range(2):
                sx, sy = rng.integers(0, 5), rng.integers(0, 14)
                if rng.integers(0, 2):
                    image[y0 + sy : y0 + sy + 3, x + sx : x + sx + 8] = 30
                else:
                    image[y0 + sy : y0 + sy + 10, x + sx : x + sx + 3] = 30
    image += rng.normal(0, 4, image.shape)
    rgb = np.repeat(np.clip(image, 0, 255).astype(np.uint8)[..., None], 3, axis=2)
    return KeyFrame(stream_id="s", t_media=2.0, image=rgb, index=7, reason="change"), boxes


CONFIG = TransportConfig(text_px=30, noisy_text_px=20)


def _rebuild(m: PatchMessage, held: dict[int, np.ndarray] | None = None) -> np.ndarray:
    image = decode_patches(m.payload, m.shape, stream_id="s", arrival_wall=0.0, references=held)
    return image.image[..., 0].astype(np.int16)


def test_ladder_steps_keep_a_noisy_frames_own_coding_and_mark_what_is_not_complete() -> None:
    page, boxes = _filmed_page()
    finest = encode_patches(page, boxes, 1.0, CONFIG)
    assert finest.levels == 4 and finest.scale == pytest.approx(20 / 24) and finest.complete
    # A measured-ladder step: the noisy coding, 0.8 x smaller, 3 levels.
    step = encode_patches(page, boxes, 1.0, CONFIG, None, 0.8, 3)
    assert step.levels == 3 and step.scale == pytest.approx(0.8 * 20 / 24)
    assert len(step.payload) < len(finest.payload) and not step.complete
    # The old step: the clean frames' coding (30 px -> full size, x 0.8) at 2 levels.
    old = encode_patches(page, boxes, 1.0, CONFIG, None, 0.8)
    assert old.levels == 2 and old.scale == pytest.approx(0.8)
    # A clean frame keeps its 2 levels at any step.
    clean = dataclasses.replace(page, image=np.where(page.image < 128, 30, 225).astype(np.uint8))
    assert encode_patches(clean, boxes, 1.0, CONFIG, None, 0.8, 3).levels == 2
    # Text cut: not complete either.
    assert not encode_patches(page, boxes, 0.05, CONFIG).complete


def test_a_refinement_sends_the_finest_coding_band_by_band_over_the_clouds_copy() -> None:
    page, boxes = _filmed_page()
    finest = encode_patches(page, boxes, 1.0, CONFIG)
    fine = _rebuild(finest)
    coarse = _rebuild(encode_patches(page, boxes, 1.0, CONFIG, None, 0.65))
    top, bottom = slice(30, 30 + 52 * 2), slice(30 + 52 * 4, 360)  # first 2 / last 2 lines
    # Part 1 of 2: the upper half of the text, the rest the cloud's coarse copy.
    one = encode_patches(
        page, boxes, 1.0, CONFIG, Reference(7, coarse.astype(np.uint8)), 1.0, None, (0.0, 0.5)
    )
    assert 0 < one.kept < finest.kept and one.kept + one.reused == finest.candidates
    assert len(one.payload) < 0.7 * len(finest.payload)
    after_one = _rebuild(one, {7: coarse.astype(np.uint8)})
    assert np.array_equal(after_one[bottom], coarse[bottom])  # pixel for pixel, as it was
    err = {
        name: np.abs(img[top] - fine[top]).mean()
        for name, img in (("one", after_one), ("coarse", coarse))
    }
    assert err["one"] < 0.5 * err["coarse"]
    # Part 2 of 2: the lower half; the upper half stays as part 1 left it.
    two = encode_patches(
        page, boxes, 1.0, CONFIG, Reference(7, after_one.astype(np.uint8)), 1.0, None, (0.5, 1.0)
    )
    assert one.kept + two.kept == finest.kept
    after_two = _rebuild(two, {7: after_one.astype(np.uint8)})
    assert np.array_equal(after_two[top], after_one[top])
    assert (
        np.abs(after_two[bottom] - fine[bottom]).mean()
        < 0.5 * np.abs(coarse[bottom] - fine[bottom]).mean()
    )
    # Text as the finest coding draws it: ink where it has ink.
    assert ((after_two < 128) == (fine < 128)).mean() > 0.995
    # A part needs the cloud's copy of the frame.
    with pytest.raises(WireError, match="not held"):
        _rebuild(two)
    with pytest.raises(ValueError, match="copy"):
        encode_patches(page, boxes, 1.0, CONFIG, None, 1.0, None, (0.0, 0.5))


def test_the_cloud_holds_the_last_message_of_each_key_frame() -> None:
    grey = np.zeros((4, 4), dtype=np.uint8)
    a, a2, b = Reference(1, grey), Reference(1, grey + 1), Reference(2, grey)
    acked = {10, 11, 12}
    assert held_reference([(10, a), (11, a2), (12, b)], acked.__contains__) is b
    # Frame 2 not acknowledged yet: frame 1's last part.
    assert held_reference([(10, a), (12, b), (13, a2)], {10, 13}.__contains__) is a2
    # Frame 1's last part in flight: the cloud may hold either version; none is used.
    assert held_reference([(10, a), (11, a2)], {10}.__contains__) is None


async def _refine(
    budget: float | None,
    *,
    stop_after_start: bool = False,
    deadline_s: float = 2.0,
    delay_ms: float = 0.0,
    start_after_s: float = 0.0,
    bandwidth_bps: float | None = None,
    stop_when_sent: bool = False,
) -> dict[str, object]:
    page, boxes = _filmed_page()
    config = CONFIG.model_copy(update={"deadline_s": deadline_s})
    rx = await UdpReceiver.listen("127.0.0.1", 0, config)
    faults = FaultConfig(delay_ms=delay_ms, bandwidth_bps=bandwidth_bps)
    proxy = FaultProxy(rx.address, faults)
    tx = await UdpSender.connect(*await proxy.start(), config)
    held: dict[int, np.ndarray] = {}
    rebuilt: list[np.ndarray] = []

    async def cloud() -> None:  # as `CloudSource` rebuilds key frames
        async for m in rx.messages():
            if m.header.modality is Modality.VIDEO_PATCHES:
                key = decode_patches(
                    m.payload, m.header.shape, stream_id="s", arrival_wall=0.0, references=held
                )
                held[key.index] = key.image[..., 0]
                rebuilt.append(key.image[..., 0])

    consumer = asyncio.create_task(cloud())
    await tx.send_reliable(Packet(kind=Kind.CONTROL, modality=Modality.JSON), b"{}", 5)
    if bandwidth_bps is not None:  # measured, so the sender paces
        await tx.wait_acked(tx.probe(), 5.0)
        await tx.drain(5.0)
        await asyncio.sleep(2.5)  # the probe's early repairs through the bottleneck
    parts: list[PatchMessage] = []
    bases = []  # the message each part copies from, and whether the cloud had acknowledged it
    withdrawn: list[int | None] = []

    def send(key: KeyFrame, message: PatchMessage, grey: np.ndarray) -> int:
        parts.append(message)
        bases.append((sent[-1], tx.acked(sent[-1])))
        sent.append(
            tx.send(Packet(modality=Modality.VIDEO_PATCHES, shape=message.shape), message.payload)
        )
        return sent[-1]

    coarse = encode_patches(page, boxes, 1.0, config, None, 0.65)
    seq = tx.send(Packet(modality=Modality.VIDEO_PATCHES, shape=coarse.shape), coarse.payload)
    sent = [seq]
    refiner = Refiner(tx, config, lambda _link: budget, send)
    await asyncio.sleep(start_after_s)
    refiner.start(page, boxes, seq, _rebuild(coarse).astype(np.uint8))
    if stop_after_start:
        refiner.stop()  # a new key frame: nothing more of this one
    if stop_when_sent:
        for _ in range(2000):
            if parts:
                break
            await asyncio.sleep(0.005)
        withdrawn.append(refiner.stop())  # a new key frame while the part is being paced
    await refiner.wait(20.0)
    await tx.drain(3.0)
    await asyncio.sleep(1.0 if stop_when_sent else 0.2)  # the notice behind what left
    await rx.close()
    await consumer
    await tx.close()
    await proxy.close()
    finest = encode_patches(page, boxes, 1.0, refine_config(config))
    return {
        "parts": parts,
        "refiner": refiner,
        "rebuilt": rebuilt,
        "finest": finest,
        "fine": _rebuild(finest),
        "sender": tx,
        "receiver": rx,
        "bases": bases,
        "withdrawn": withdrawn,
    }


def test_the_refiner_sends_parts_within_the_budget_until_the_cloud_holds_the_finest_coding() -> (
    None
):
    finest_bytes = len(encode_patches(*_filmed_page(), 1.0, refine_config(CONFIG)).payload)
    budget = finest_bytes / 2.2
    r = asyncio.run(_refine(budget))
    parts, refiner = r["parts"], r["refiner"]
    assert isinstance(parts, list) and isinstance(refiner, Refiner)
    assert (
        len(parts) == math.ceil(1.25 * 2.2 / 0.6) == refiner.parts_sent
        and refiner.frames_refined == 1
    )
    assert all(len(p.payload) <= budget for p in parts)
    rebuilt = r["rebuilt"]
    assert isinstance(rebuilt, list) and len(rebuilt) == 1 + len(parts)
    fine = r["fine"]
    assert isinstance(fine, np.ndarray)
    last, first = rebuilt[-1].astype(np.int16), rebuilt[0].astype(np.int16)
    assert np.abs(last - fine).mean() < 0.3 * np.abs(first - fine).mean()
    assert ((last < 128) == (fine < 128)).mean() > 0.995


def test_each_part_is_sent_only_once_the_cloud_acknowledged_the_message_it_copies_from() -> None:
    # 100 ms each way: with two parts in flight, part j + 1 left while part j (its base) was
    # still on its way, and was undecodable at the cloud whenever part j was lost.
    finest_bytes = len(encode_patches(*_filmed_page(), 1.0, refine_config(CONFIG)).payload)
    r = asyncio.run(_refine(finest_bytes / 2.2, delay_ms=100))
    bases, parts, rebuilt = r["bases"], r["parts"], r["rebuilt"]
    assert isinstance(bases, list) and isinstance(parts, list) and isinstance(rebuilt, list)
    assert len(parts) >= 3 and len(rebuilt) == 1 + len(parts)
    assert all(acked for _base, acked in bases)


def test_a_new_key_frame_withdraws_the_part_still_waiting_for_the_pacer() -> None:
    # 50 kbit/s: the finest coding in one part (3 datagrams) takes ~0.5 s at the bottleneck.
    # A new key frame must not wait behind it: `stop` withdraws it, the cloud skips it, and
    # later key frames do not copy from it.
    r = asyncio.run(_refine(None, bandwidth_bps=50_000, stop_when_sent=True, deadline_s=5.0))
    withdrawn, parts, rebuilt = r["withdrawn"], r["parts"], r["rebuilt"]
    refiner, tx, rx = r["refiner"], r["sender"], r["receiver"]
    assert isinstance(refiner, Refiner) and isinstance(tx, UdpSender)
    assert isinstance(rx, UdpReceiver) and isinstance(parts, list)
    assert isinstance(rebuilt, list) and isinstance(withdrawn, list)
    assert len(parts) == 1 and withdrawn[0] is not None and tx.lost(withdrawn[0])
    assert refiner.parts_abandoned == 1 and refiner.frames_refined == 1
    assert rx.stats.abandoned == 1 and rx.stats.late_dropped == 0
    assert len(rebuilt) == 1  # the coarse frame alone
    # The next key frame copies from what the cloud holds: the coarse frame, not the part.
    grey = np.zeros((4, 4), dtype=np.uint8)
    coarse, part = Reference(7, grey), Reference(7, grey + 1)
    refs = [(0, coarse), (withdrawn[0], part)]
    assert held_reference(refs, tx.acked) is None  # why the edge drops a withdrawn part


def test_the_refiner_stops_for_a_new_key_frame_and_skips_a_link_too_slow_for_it() -> None:
    stopped = asyncio.run(_refine(1e9, stop_after_start=True))
    assert stopped["parts"] == []
    finest_bytes = len(encode_patches(*_filmed_page(), 1.0, refine_config(CONFIG)).payload)
    slow = asyncio.run(_refine(finest_bytes / 10))  # > 10 parts: not worth it
    assert slow["parts"] == []
    # No budget known: the finest coding in one part.
    whole = asyncio.run(_refine(None))
    parts = whole["parts"]
    assert isinstance(parts, list) and len(parts) == 1


def test_the_deadline_budget_counts_our_own_queue_once_on_the_paths_own_delay() -> None:
    # Refinement parts keep the link busy: RTT samples then carry the queue they wait in, and
    # the smoothed RTT remembers it after it drained. The budget takes the path's delay (the
    # smallest recent sample) and the bytes queued now.
    rtt = RttEstimator()
    for sample in (0.08, 0.3, 0.5, 0.45):
        rtt.sample(sample)
    assert rtt.min_rtt_s == 0.08 and rtt.srtt_s is not None and rtt.srtt_s > 0.15
    policy = DeadlineKeepPolicy(1.5, 0.05, headroom=1.0)
    busy = LinkEstimate(rtt.srtt_s, rtt.rto_s, 0.0, 200_000, 0, rtt.min_rtt_s)
    assert policy.budget_bytes(busy) == pytest.approx(25_000 * (1.5 - 0.08))
    queued = dataclasses.replace(busy, queued_bytes=10_000)  # 0.4 s of the link
    assert policy.budget_bytes(queued) == pytest.approx(25_000 * (1.5 - 0.08 - 0.4))
    # Repairing loss takes two trips on the path (not the smoothed RTT, which holds the
    # queue); at 5% loss most frames of ~29 fragments need one.
    lossy = dataclasses.replace(busy, loss=0.05)
    fragments = math.ceil(25_000 * 0.95 * 1.42 / policy.fragment_bytes)
    repair = (1 - 0.95**fragments) * 2 * 0.08
    assert 0.7 * 0.16 < repair < 0.16
    expected = 25_000 * 0.95 * (1.5 - 0.08 - repair)
    assert policy.budget_bytes(lossy) == pytest.approx(expected)


def test_a_coarse_frame_whose_ack_comes_after_its_deadline_is_still_refined() -> None:
    # 200 ms each way, a 0.3 s deadline: the coarse message reaches the cloud in time, its ACK
    # reaches the edge after the deadline. The refinement starting in between must not read
    # the coarse message as lost (the cloud holds it): the finest coding follows.
    r = asyncio.run(_refine(None, deadline_s=0.3, delay_ms=200, start_after_s=0.33))
    parts, refiner, rebuilt, tx = r["parts"], r["refiner"], r["rebuilt"], r["sender"]
    assert isinstance(parts, list) and isinstance(refiner, Refiner)
    assert isinstance(rebuilt, list) and isinstance(tx, UdpSender)
    assert len(parts) == 1 and refiner.frames_refined == 1
    assert len(rebuilt) == 2  # the coarse frame and the part, both delivered
    assert tx.stats.late_acks >= 1 and tx.stats.expired == 0
