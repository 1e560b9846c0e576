"""The glyph-dictionary coding of a key frame's text (`transport.glyphs`): exact when the match
rule is exact, repeated glyphs sent once, similar-looking glyphs (6 and 8) never swapped, and a
malformed payload a `WireError`, whatever the bytes."""

from __future__ import annotations

import hashlib

import cv2
import numpy as np
import pytest
from scipy import ndimage

from streamfuse.transport.config import TransportConfig
from streamfuse.transport.glyphs import MatchRule, decode_glyphs, encode_glyphs, text_bitmap
from streamfuse.transport.wire import WireError
from streamfuse.vision.frames import KeyFrame

pytestmark = pytest.mark.unit

CONFIG = TransportConfig()


def _page(lines: list[str], noise: float = 0.0) -> tuple[KeyFrame, list[tuple[int, int, int, int]]]:
    """Dark text on light paper, one 32 px box per line; `noise`: sensor noise sigma."""
    image = np.full((60 + 44 * len(lines), 760), 228, dtype=np.uint8)
    boxes = []
    for i, text in enumerate(lines):
        y = 44 + i * 44
        cv2.putText(image, text, (20, y), cv2.FONT_HERSHEY_SIMPLEX, 0.8, 25, 2, cv2.LINE_8)
        boxes.append((14, y - 24, 740, y + 8))
    if noise:
        rng = np.random.default_rng(3)
        image = np.clip(image + rng.normal(0, noise, image.shape), 0, 255).astype(np.uint8)
    rgb = np.ascontiguousarray(np.repeat(image[..., None], 3, axis=2))
    frame = KeyFrame(stream_id="s", t_media=4.5, image=rgb, index=9, reason="change")
    return frame, boxes


def _decoded_ink(payload: bytes) -> tuple[KeyFrame, np.ndarray]:
    frame = decode_glyphs(payload, stream_id="s", arrival_wall=1.0)
    grey = frame.image[..., 0]
    return frame, grey < (int(grey.max()) + int(grey.min())) // 2


def test_exact_rule_round_trips_the_text_picture() -> None:
    frame, boxes = _page(["The quick brown fox 0123", "jumps over 456789 lazy dogs"])
    # text_px above the lines' 32 px: sent at full size, so the picture compares pixel for pixel.
    message = encode_glyphs(frame, boxes, CONFIG, text_px=40, rule=MatchRule(hausdorff_px=0))
    ink, scale, _paper, _ink, _boxes = text_bitmap(frame, boxes, CONFIG, 40)
    assert scale == 1.0 and message.scale == 1.0
    decoded, got = _decoded_ink(message.payload)
    assert np.array_equal(got, ink)
    assert ink.sum() > 1000
    assert (decoded.t_media, decoded.index, decoded.reason) == (4.5, 9, "change")
    assert decoded.image.shape == frame.image.shape


def test_repeated_glyphs_go_once_and_6_never_stands_for_8() -> None:
    frame, boxes = _page(["6868 6868 6868 6868 6868"] * 4)
    message = encode_glyphs(frame, boxes, CONFIG, text_px=40)
    ink = text_bitmap(frame, boxes, CONFIG, 40)[0]
    labels, n = ndimage.label(ink, structure=np.ones((3, 3), dtype=bool))
    assert message.glyphs == n == 80
    # Two digits; a few more shapes where a patch's own threshold adds a faint row to a line.
    assert 2 <= message.shapes <= 8
    got = _decoded_ink(message.payload)[1]
    slices = ndimage.find_objects(labels)
    first = sorted(range(n), key=lambda i: (slices[i][0].start > 40, slices[i][1].start))[:2]
    six, eight = (labels[slices[i]] == i + 1 for i in first)
    rows = min(len(six), len(eight))  # bottoms aligned (the 6 is a pixel taller)
    assert (six[-rows:] ^ eight[-rows:]).sum() > 20
    # Each glyph comes back within a pixel or two of itself: never the other digit.
    for i, sl in enumerate(ndimage.find_objects(labels), start=1):
        assert ((labels[sl] == i) ^ got[sl]).sum() <= 6


def test_default_rule_keeps_a_t_apart_from_an_l() -> None:
    """An 'l' (a 3 x 24 bar) and a 't' (the bar with a 1 px crossbar stub, 9 rows): every
    pixel of each within a pixel of the other, 9 pixels (11-12% of the ink) differ. At 20%
    (the first rule) the 't' became an 'l' on filmed pages; at the default 10% it stays."""
    image = np.full((80, 400), 228, dtype=np.uint8)
    for i, x in enumerate(range(20, 380, 12)):
        image[30:54, x : x + 3] = 25
        if i % 2:
            image[34:43, x + 3] = 25
    rgb = np.ascontiguousarray(np.repeat(image[..., None], 3, axis=2))
    frame = KeyFrame(stream_id="s", t_media=0.0, image=rgb, index=1)
    boxes = [(10, 26, 390, 58)]
    ink = text_bitmap(frame, boxes, CONFIG, 40)[0]
    strict = encode_glyphs(frame, boxes, CONFIG, text_px=40)
    assert (strict.glyphs, strict.shapes) == (30, 2)
    assert np.array_equal(_decoded_ink(strict.payload)[1], ink)
    loose = encode_glyphs(frame, boxes, CONFIG, text_px=40, rule=MatchRule(max_xor=0.2))
    assert (loose.glyphs, loose.shapes) == (30, 1)
    assert not np.array_equal(_decoded_ink(loose.payload)[1], ink)


def test_noisy_page_is_smaller_than_exact_and_reads_the_same_shapes() -> None:
    frame, boxes = _page(["Pack my box with five dozen liquor jugs"] * 6, noise=6.0)
    exact = encode_glyphs(frame, boxes, CONFIG, text_px=26, rule=MatchRule(hausdorff_px=0))
    loose = encode_glyphs(frame, boxes, CONFIG, text_px=26)
    assert loose.glyphs == exact.glyphs
    assert loose.shapes < exact.shapes
    assert len(loose.payload) < len(exact.payload)
    # Every component of the decoded picture lies within a pixel of the original's ink.
    ink = text_bitmap(frame, boxes, CONFIG, 26)[0]
    decoded = decode_glyphs(loose.payload, stream_id="s", arrival_wall=0.0).image[..., 0]
    small = cv2.resize(decoded, (ink.shape[1], ink.shape[0]), interpolation=cv2.INTER_AREA)
    got = small < 128
    near = cv2.dilate(ink.view(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    assert (got & ~near).sum() <= 0.02 * got.sum()


def test_malformed_payloads_raise_wire_error_only() -> None:
    frame, boxes = _page(["Sphinx of black quartz, judge my vow 1234567890"] * 3)
    payload = encode_glyphs(frame, boxes, CONFIG, text_px=26).payload
    rng = np.random.default_rng(5)
    bad = [b"", b"GL1", payload[:20], payload[: len(payload) // 2], b"XX" + payload[2:]]
    for _ in range(150):
        data = bytearray(payload)
        for pos in rng.integers(0, len(data), size=int(rng.integers(1, 4))):
            data[pos] ^= int(rng.integers(1, 256))
        bad.append(bytes(data))
    bad += [rng.bytes(int(n)) for n in rng.integers(1, 3000, size=30)]
    errors = 0
    for data in bad:
        try:
            decode_glyphs(data, stream_id="s", arrival_wall=0.0)
        except WireError:
            errors += 1
    assert errors >= 5  # at least the structurally broken ones; bit flips may decode
    with pytest.raises(WireError, match="glyph message"):
        decode_glyphs(payload[:-40], stream_id="s", arrival_wall=0.0)


#: (bytes, sha256 of the payload, sha256 of the decoded picture) of a noisy page as the first
#: implementation (80cbd52: one numpy comparison per shape, one call per bit through the range
#: coder) coded and decoded it: the faster coder must send the same bytes, so the measured
#: bytes and reads in docs/edge-cloud.md still hold, and rebuild the same picture.
PINNED = {
    "default": (
        1740,
        "7f5d4fb6f21d4b8274de7328f1b68b0149111d9f4bf57d76743b97b56ab70269",
        "9caa087b95f27ff5824227e646ab3fed5d8bad73f8071835ef5cfaf0120fed16",
    ),
    "h0": (
        2324,
        "9d6183605e82f9588be446487025e8321530d0ebc4f11746c7c8a7aa21af1838",
        "5f8542c471431aa2c6961b29fa447d210d0aec31b9570c3f38149a5b97683470",
    ),
    "x20t2": (
        1281,
        "b8f8d8ac1ecd5f9b13c311fe7563e2ee219b37d5c45631b734b4cd04cf221a4f",
        "ececd3f5614780878c0c44dedfd9244e84fe2b30d70d951a1ac33a47100afe19",
    ),
}
PINNED_RULES = {
    "default": (26, MatchRule()),
    "h0": (26, MatchRule(hausdorff_px=0)),
    "x20t2": (20, MatchRule(max_xor=0.2, max_thick=2)),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_payload_bytes_are_pinned(name: str) -> None:
    frame, boxes = _page(
        [
            "Pack my box with five dozen liquor jugs 0123456789",
            "The quick brown fox jumps over 6868 lazy dogs",
        ]
        * 3,
        noise=6.0,
    )
    px, rule = PINNED_RULES[name]
    message = encode_glyphs(frame, boxes, CONFIG, text_px=px, rule=rule)
    size, digest, picture = PINNED[name]
    assert (len(message.payload), hashlib.sha256(message.payload).hexdigest()) == (size, digest)
    again = decode_glyphs(message.payload, stream_id="s", arrival_wall=0.0)
    assert hashlib.sha256(again.image.tobytes()).hexdigest() == picture
