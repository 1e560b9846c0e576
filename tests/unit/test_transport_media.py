"""What crosses the link: sparse patch tokens of a key frame (ranking, keep ratio, bitmap
run-length coding, reassembly) and VAD-gated Opus speech (only speech sent, aligned on the
media clock after decoding)."""

from __future__ import annotations

import dataclasses
import json
import lzma

import av
import cv2
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamfuse.assets import demo_files
from streamfuse.frames import AudioFrame
from streamfuse.sources.media import MonoResampler
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.patches import (
    _LZMA_FILTERS,
    _MAX_BODY,
    PatchMessage,
    Reference,
    decode_patches,
    encode_patches,
    global_shift,
    noise_sigma,
    rle_decode,
    rle_encode,
    text_scale,
)
from streamfuse.transport.speech import OPUS_FRAME, SpeechDecoder, SpeechEncoder
from streamfuse.transport.tensor import dequantize, tensor_packet
from streamfuse.transport.wire import DType, WireError, decode, encode, fragment
from streamfuse.vision.frames import KeyFrame

pytestmark = pytest.mark.unit


@given(st.lists(st.booleans(), max_size=3000))
def test_run_length_mask_round_trips(bits: list[bool]) -> None:
    arr = np.array(bits, dtype=bool)
    assert np.array_equal(rle_decode(rle_encode(arr), arr.size), arr)


def test_run_length_mask_rejects_runs_that_do_not_add_up() -> None:
    with pytest.raises(WireError):
        rle_decode(rle_encode(np.ones(10, dtype=bool)), 9)
    with pytest.raises(WireError):
        rle_decode(b"\x80\x80", 4)  # unterminated varint


def _slide() -> tuple[KeyFrame, list[tuple[int, int, int, int]]]:
    rng = np.random.default_rng(0)
    image = np.full((120, 200, 3), 230, dtype=np.uint8)
    boxes = [(10, 10, 90, 26), (10, 60, 190, 76)]
    for x0, y0, x1, y1 in boxes:  # "text": dark noise inside each box
        image[y0:y1, x0:x1] = rng.integers(0, 80, size=(y1 - y0, x1 - x0, 1), dtype=np.uint8)
    frame = KeyFrame(
        stream_id="s",
        t_media=3.5,
        image=image,
        index=105,
        changed_bbox=(0, 50, 200, 90),
        changed_frac=0.4,
        t_changed=3.1,
        reason="change",
    )
    return frame, boxes


def test_patches_keep_text_and_rebuild_it_exactly_with_png() -> None:
    frame, boxes = _slide()
    config = TransportConfig(patch_codec="png", grey_levels=256, text_pad_px=0, patch_px=8)
    message = encode_patches(frame, boxes, 1.0, config)
    rebuilt = decode_patches(message.payload, message.shape, stream_id="s", arrival_wall=1.0)
    assert message.kept == message.candidates < (15 * 25)  # background patches never sent
    for x0, y0, x1, y1 in boxes:  # PNG is lossless: the text is bit-exact (grey)
        assert np.array_equal(rebuilt.image[y0:y1, x0:x1, 0], frame.image[y0:y1, x0:x1, 0])
    assert (rebuilt.image[100:, :, 0] == 230).all()  # background filled
    assert (rebuilt.t_media, rebuilt.index, rebuilt.reason) == (3.5, 105, "change")
    assert rebuilt.changed_bbox == frame.changed_bbox and rebuilt.t_changed == 3.1


def test_keep_ratio_keeps_the_changed_text_first() -> None:
    frame, boxes = _slide()
    config = TransportConfig(patch_codec="png", grey_levels=256, text_pad_px=0, patch_px=8)
    full = encode_patches(frame, boxes, 1.0, config)
    n_cells = full.shape[0] * full.shape[1]
    part = encode_patches(frame, boxes, 0.1, config)
    assert part.kept == int(np.ceil(0.1 * n_cells)) < full.kept
    assert len(part.payload) < len(full.payload)
    rebuilt = decode_patches(part.payload, part.shape, stream_id="s", arrival_wall=0.0)
    # The second line lies in the changed region: it outranks the first.
    assert np.array_equal(rebuilt.image[64:72, 16:184, 0], frame.image[64:72, 16:184, 0])
    assert (rebuilt.image[10:26, 10:90, 0] == 230).any()


def test_quantized_patches_keep_each_patch_range_and_shrink_the_payload() -> None:
    frame, boxes = _slide()
    exact = TransportConfig(grey_levels=256, text_pad_px=0, patch_px=8)
    four = TransportConfig(grey_levels=4, text_pad_px=0, patch_px=8)
    a, b = encode_patches(frame, boxes, 1.0, exact), encode_patches(frame, boxes, 1.0, four)
    assert len(b.payload) < 0.7 * len(a.payload)
    rebuilt = decode_patches(b.payload, b.shape, stream_id="s", arrival_wall=0.0)
    x0, y0, x1, y1 = boxes[0]
    original = frame.image[y0:y1, x0:x1, 0].astype(int)
    got = rebuilt.image[y0:y1, x0:x1, 0].astype(int)
    # 4 levels over a patch's own range (at most 0..230 here, where a patch holds paper too):
    # every pixel within half a step of the truth, and the range itself kept.
    assert np.abs(got - original).max() <= 230 / 3 / 2 + 1
    assert got.min() == original.min() and got.max() <= 230


def test_malformed_patch_payload_is_a_wire_error() -> None:
    frame, boxes = _slide()
    message = encode_patches(frame, boxes, 1.0, TransportConfig())
    for bad in (message.payload[:10], message.payload[:-50], b"\0" * 3):
        with pytest.raises(WireError):
            decode_patches(bad, message.shape, stream_id="s", arrival_wall=0.0)


@pytest.mark.parametrize("levels", [2, 4, 16])
def test_packed_patches_rebuild_the_same_pixels_as_the_png_atlas_in_fewer_bytes(
    levels: int,
) -> None:
    frame, boxes = _slide()
    packed = TransportConfig(grey_levels=levels, text_pad_px=0, patch_px=8)
    png = packed.model_copy(update={"patch_codec": "png"})
    a, b = encode_patches(frame, boxes, 1.0, packed), encode_patches(frame, boxes, 1.0, png)
    rebuilt_a = decode_patches(a.payload, a.shape, stream_id="s", arrival_wall=0.0)
    rebuilt_b = decode_patches(b.payload, b.shape, stream_id="s", arrival_wall=0.0)
    assert np.array_equal(rebuilt_a.image, rebuilt_b.image)
    assert len(a.payload) < len(b.payload)


def _big_text_slide() -> tuple[KeyFrame, list[tuple[int, int, int, int]]]:
    """A 640x360 slide with two 60 px tall lines of random 'glyphs' (8 px strokes)."""
    rng = np.random.default_rng(3)
    image = np.full((360, 640, 3), 235, dtype=np.uint8)
    boxes = [(40, 40, 600, 100), (40, 200, 520, 260)]
    for x0, y0, x1, _y1 in boxes:
        for x in range(x0 + 4, x1 - 24, 24):
            for _ in range(3):
                sx, sy = rng.integers(0, 12), rng.integers(6, 40)
                horizontal = bool(rng.integers(0, 2))
                ww, hh = (16, 8) if horizontal else (8, 16)
                image[y0 + sy : y0 + sy + hh, x + sx : x + sx + ww] = 20
    frame = KeyFrame(stream_id="s", t_media=1.0, image=image, index=3, reason="change")
    return frame, boxes


def test_large_text_is_sent_scaled_down_and_rebuilt_at_full_size() -> None:
    frame, boxes = _big_text_slide()
    config = TransportConfig(text_px=30)
    assert text_scale(boxes, config) == pytest.approx(0.5)
    assert text_scale([(0, 0, 50, 20)], config) == 1.0  # small text is never scaled
    assert text_scale(boxes, TransportConfig(text_px=0)) == 1.0
    scaled = encode_patches(frame, boxes, 1.0, config)
    full = encode_patches(frame, boxes, 1.0, TransportConfig(text_px=0))
    assert scaled.scale == pytest.approx(0.5) and full.scale == 1.0
    assert scaled.shape[:2] == (12, 20) and full.shape[:2] == (23, 40)
    assert len(scaled.payload) < 0.8 * len(full.payload)
    rebuilt = decode_patches(scaled.payload, scaled.shape, stream_id="s", arrival_wall=0.0)
    assert rebuilt.image.shape == frame.image.shape and rebuilt.index == 3
    # The strokes come back where they were: dark inside the bars, paper between lines.
    for x0, y0, x1, y1 in boxes:
        ink = frame.image[y0:y1, x0:x1, 0] < 128
        got = rebuilt.image[y0:y1, x0:x1, 0] < 128
        assert (ink == got).mean() > 0.9
    assert (rebuilt.image[130:180, :, 0] > 200).all()


def test_unchanged_patches_are_copied_from_the_clouds_last_key_frame_across_a_camera_shift() -> (
    None
):
    frame, boxes = _big_text_slide()
    config = TransportConfig(text_px=0, noisy_text_px=0)
    first = encode_patches(frame, boxes, 1.0, config)
    held = decode_patches(first.payload, first.shape, stream_id="s", arrival_wall=0.0)
    reference = Reference(frame.index, held.image[..., 0])
    # The camera moved 3 px right, 2 px down; sensor noise; nothing else changed.
    noise = np.random.default_rng(5).normal(0, 2, frame.image.shape)
    moved = np.clip(np.roll(frame.image, (2, 3), axis=(0, 1)) + noise, 0, 255).astype(np.uint8)
    shift = global_shift(cv2.cvtColor(moved, cv2.COLOR_RGB2GRAY), reference.grey)
    assert shift is not None and shift == (pytest.approx(3, abs=0.5), pytest.approx(2, abs=0.5))
    moved_boxes = [(x0 + 3, y0 + 2, x1 + 3, y1 + 2) for x0, y0, x1, y1 in boxes]
    again = dataclasses.replace(frame, image=moved, index=9)
    second = encode_patches(again, moved_boxes, 1.0, config, reference)
    assert second.reused > 0.8 * second.candidates and len(second.payload) < len(first.payload) / 3
    rebuilt = decode_patches(
        second.payload,
        second.shape,
        stream_id="s",
        arrival_wall=0.0,
        references={frame.index: reference.grey},
    )
    ink = moved[..., 0] < 128
    assert ((rebuilt.image[..., 0] < 128) == ink).mean() > 0.97
    with pytest.raises(WireError, match="not held"):
        decode_patches(second.payload, second.shape, stream_id="s", arrival_wall=0.0)
    # A line that changed is sent, not copied.
    changed = moved.copy()
    x0, y0, x1, y1 = moved_boxes[1]
    changed[y0:y1, x0:x1] = 235
    changed[y0 + 10 : y1 - 10, x0 + 20 : x1 - 20 : 3] = 20
    third = encode_patches(
        dataclasses.replace(again, image=changed, index=10), moved_boxes, 1.0, config, reference
    )
    rebuilt = decode_patches(
        third.payload,
        third.shape,
        stream_id="s",
        arrival_wall=0.0,
        references={frame.index: reference.grey},
    )
    assert third.kept > second.kept
    line = (slice(y0, y1), slice(x0, x1), 0)
    assert ((rebuilt.image[line] < 128) == (changed[line] < 128)).mean() > 0.95


def test_patch_payloads_that_inflate_too_far_or_scale_too_far_are_wire_errors() -> None:
    bomb = lzma.compress(b"\0" * (_MAX_BODY + 1000), format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    with pytest.raises(WireError, match="inflates"):
        decode_patches(bomb, (10, 10, 16), stream_id="s", arrival_wall=0.0)
    frame, boxes = _slide()
    message = encode_patches(frame, boxes, 1.0, TransportConfig())
    body = lzma.decompress(message.payload, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    n_meta = int.from_bytes(body[:4], "big")
    meta = body[4 : 4 + n_meta].replace(b'"w":200', b'"w":20000')
    forged = len(meta).to_bytes(4, "big") + meta + body[4 + n_meta :]
    payload = lzma.compress(forged, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    with pytest.raises(WireError, match="out of range"):
        decode_patches(payload, message.shape, stream_id="s", arrival_wall=0.0)


def _demo_audio(seconds: float) -> np.ndarray:
    with demo_files() as files, av.open(str(files.clip)) as c:
        resample, pieces = MonoResampler(), []
        for frame in c.decode(audio=0):
            pieces.append(resample(frame))
            if sum(map(len, pieces)) > seconds * 16_000:
                break
    return np.concatenate(pieces)[: int(seconds * 16_000)]


def test_speech_round_trip_is_aligned_and_silence_is_not_sent() -> None:
    speech = _demo_audio(4.0)
    # Two seconds of silence, then speech: the silence must not be sent.
    x = np.concatenate([np.zeros(32_000, dtype=np.float32), speech])
    encoder = SpeechEncoder(chunk_s=0.5)
    chunks = []
    for i in range(0, len(x) - OPUS_FRAME + 1, OPUS_FRAME):
        window = AudioFrame(samples=x[i : i + OPUS_FRAME], t_media=i / 16_000)
        chunks += encoder.push(window)
    chunks += encoder.flush()
    assert chunks and min(c.t_media for c in chunks) > 2.0 - encoder.pad_s - 0.05
    assert encoder.speech_s < encoder.audio_s - 1.5
    decoder, y = SpeechDecoder(), np.zeros_like(x)
    for chunk in chunks:
        t, samples = decoder.decode(chunk.payload())
        i = round(t * 16_000)
        y[i : i + len(samples)] = samples[: len(y) - i]
    sent = y != 0
    assert sent.sum() > 16_000
    # Opus at 16 kbit/s keeps the waveform; a misalignment of even a few samples would not.
    assert np.corrcoef(x[sent], y[sent])[0, 1] > 0.85
    with pytest.raises(WireError):
        decoder.decode(chunks[0].payload()[:-3])


@pytest.mark.parametrize(
    ("dtype", "rel_error"),
    [(DType.FLOAT32, 0.0), (DType.INT8, 0.5 / 127), (DType.FLOAT8_E4M3, 0.07)],
)
def test_tensors_cross_the_wire_within_their_code_error(dtype: DType, rel_error: float) -> None:
    x = np.random.default_rng(0).standard_normal((2, 50, 16)).astype(np.float32)
    header, payload = tensor_packet(x, dtype)
    parts = [decode(encode(p)) for p in fragment(header, payload, 600)]
    first = parts[0]
    back = dequantize(
        b"".join(p.payload for p in parts), first.shape, first.dtype, first.quant_scale
    )
    peak = float(np.abs(x).max())
    # INT8: half a step of max|x|/127 everywhere; FP8 e4m3: 3 mantissa bits (relative 1/16)
    # plus the subnormal floor near zero.
    err = np.abs(back - x)
    assert back.shape == x.shape
    assert (
        err <= rel_error * np.maximum(np.abs(x), peak if dtype is DType.INT8 else 0) + 1e-3 * peak
    ).all()
    assert len(payload) == x.size * (4 if dtype is DType.FLOAT32 else 1)
    with pytest.raises(WireError):
        dequantize(payload[:-1], first.shape, first.dtype, first.quant_scale)


def test_noisy_frames_are_denoised_before_quantization_and_clean_ones_are_not() -> None:
    frame, boxes = _slide()
    clean = np.full((120, 200), 230, dtype=np.uint8)
    noisy = np.clip(clean + np.random.default_rng(1).normal(0, 4, clean.shape), 0, 255)
    assert noise_sigma(clean) == 0.0 and noise_sigma(noisy.astype(np.uint8)) > 2.0
    grain = np.random.default_rng(2).normal(0, 4, frame.image.shape)
    camera = dataclasses.replace(frame, image=np.clip(frame.image + grain, 0, 255).astype(np.uint8))
    on, off = TransportConfig(denoise_px=3), TransportConfig(denoise_px=0)
    assert len(encode_patches(camera, boxes, 1.0, on).payload) < len(
        encode_patches(camera, boxes, 1.0, off).payload
    )
    # A clean frame codes the same either way (no blur).
    assert (
        encode_patches(frame, boxes, 1.0, on).payload
        == encode_patches(frame, boxes, 1.0, off).payload
    )


def test_noisy_frames_go_smaller_at_more_grey_levels_and_coarser_at_two() -> None:
    frame, boxes = _big_text_slide()
    grain = np.random.default_rng(4).normal(0, 4, frame.image.shape)
    camera = dataclasses.replace(frame, image=np.clip(frame.image + grain, 0, 255).astype(np.uint8))
    config = TransportConfig(text_px=30, noisy_text_px=20, noisy_grey_levels=4)

    def levels(m: PatchMessage) -> int:  # as the message's metadata announces them
        body = lzma.decompress(m.payload, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
        n = int.from_bytes(body[:4], "big")
        return int(json.loads(body[4 : 4 + n])["levels"])

    fine = encode_patches(camera, boxes, 1.0, config)
    clean = encode_patches(frame, boxes, 1.0, config)
    # Noisy: the smallest line 20 px tall (60 px -> 1/3) at 4 levels; clean: 30 px, 2 levels.
    assert fine.scale == pytest.approx(1 / 3) and clean.scale == pytest.approx(0.5)
    # The keep policy's coarser steps: 2 levels from the clean scale, each step smaller.
    coarser = [encode_patches(camera, boxes, 1.0, config, None, f) for f in (0.8, 0.65)]
    assert [m.scale for m in coarser] == [pytest.approx(0.4), pytest.approx(0.325)]
    sizes = [len(m.payload) for m in (fine, *coarser)]
    assert sizes == sorted(sizes, reverse=True)
    assert levels(fine) == 4 and levels(coarser[0]) == levels(coarser[1]) == levels(clean) == 2


def test_cells_not_sent_take_the_paper_grey_around_them_not_one_grey_for_all() -> None:
    # A page lit unevenly (paper 150 on the left to 230 on the right), two text columns.
    frame, _ = _big_text_slide()
    paper = np.linspace(150, 230, 640, dtype=np.float32)[None, :, None]
    ink = frame.image < 128
    image = np.where(ink, 20, np.broadcast_to(paper, frame.image.shape)).astype(np.uint8)
    boxes = [(40, 40, 200, 100), (40, 200, 200, 260), (420, 40, 600, 100), (420, 200, 600, 260)]
    page = dataclasses.replace(frame, image=np.ascontiguousarray(image))
    config = TransportConfig(text_px=0, text_pad_px=0)
    message = encode_patches(page, boxes, 1.0, config)
    rebuilt = decode_patches(message.payload, message.shape, stream_id="s", arrival_wall=0.0)
    grey = rebuilt.image[..., 0].astype(np.int16)
    # Just left of each text block: the fill steps by less than a table rule's edge (12 grey
    # levels) from the paper inside it; one median grey for all would step by ~30.
    for x0, y0, _x1, y1 in boxes:
        inside = grey[y0 + 2 : y1 - 2, x0 : x0 + 16].max()
        outside = np.median(grey[y0 + 2 : y1 - 2, x0 - 24 : x0 - 8])
        assert abs(int(inside) - outside) < 12, (x0, inside, outside)
    # Far from any text the frame's median grey stays.
    assert abs(int(np.median(grey[300:, :])) - int(np.median(image[..., 0]))) < 30


def test_paper_only_patches_of_a_noisy_frame_go_as_one_grey_and_text_as_before() -> None:
    frame, boxes = _big_text_slide()
    grain = np.random.default_rng(5).normal(0, 4, frame.image.shape)
    camera = dataclasses.replace(frame, image=np.clip(frame.image + grain, 0, 255).astype(np.uint8))
    flat = TransportConfig(text_px=0, noisy_text_px=0, text_pad_px=16)
    noise = flat.model_copy(update={"noisy_flat_span": 0})
    a, b = (encode_patches(camera, boxes, 1.0, c) for c in (flat, noise))
    assert a.kept == b.kept and len(a.payload) < 0.9 * len(b.payload)
    ga, gb = (
        decode_patches(m.payload, m.shape, stream_id="s", arrival_wall=0.0).image[..., 0]
        for m in (a, b)
    )
    tiles = [g[:352, :640].reshape(22, 16, 40, 16).transpose(0, 2, 1, 3) for g in (ga, gb)]
    span = np.ptp(tiles[1], axis=(2, 3))
    ink = span >= 32
    # Cells holding ink rebuild the same pixels; paper-only cells of the padding are one grey.
    assert ink.sum() > 20 and np.array_equal(tiles[0][ink], tiles[1][ink])
    paper = (span > 0) & ~ink
    assert paper.sum() > 20 and (np.ptp(tiles[0][paper], axis=(1, 2)) == 0).all()
