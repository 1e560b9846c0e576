"""The wire codec: encode/decode are inverses, every corruption is caught by the CRC, and any
bytes decode to a packet or a `WireError` (property-based with hypothesis, plus a small fuzz)."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamfuse.transport.fuzz import fuzz_decode
from streamfuse.transport.wire import (
    OVERHEAD,
    DType,
    Kind,
    Modality,
    Packet,
    WireError,
    decode,
    encode,
    fragment,
)

pytestmark = pytest.mark.unit

u32 = st.integers(0, 2**32 - 1)
u16 = st.integers(0, 2**16 - 1)
hexes = st.text("0123456789abcdef", min_size=1, max_size=1)


@st.composite
def traceparents(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return ""
    trace = draw(st.text("0123456789abcdef", min_size=32, max_size=32))
    span = draw(st.text("0123456789abcdef", min_size=16, max_size=16))
    return f"00-{trace}-{span}-{draw(st.sampled_from(['00', '01']))}"


@st.composite
def packets(draw: st.DrawFn) -> Packet:
    count = draw(st.integers(1, 2**16 - 1))
    sequence = draw(u32)
    return Packet(
        kind=draw(st.sampled_from(Kind)),
        stream=draw(u32),
        sequence=sequence,
        follows_back=draw(st.integers(0, min(sequence, 2**16 - 1))),
        media_time_us=draw(st.integers(-(2**63), 2**63 - 1)),
        modality=draw(st.sampled_from(Modality)),
        dtype=draw(st.sampled_from(DType)),
        shape=tuple(draw(st.lists(u32, max_size=8))),
        quant_scale=draw(st.floats(width=32, allow_nan=False, allow_infinity=False)),
        # keep ratio travels in 1/10000 steps
        keep_ratio=draw(st.integers(0, 10_000)) / 10_000,
        mask_bits=draw(u32),
        sample_rate=draw(u32),
        fragment_index=draw(st.integers(0, count - 1)),
        fragment_count=count,
        flags=draw(u16),
        traceparent=draw(traceparents()),
        payload=draw(st.binary(max_size=2000)),
    )


@given(packets())
def test_decode_inverts_encode(p: Packet) -> None:
    assert decode(encode(p)) == p


@given(packets(), st.data())
def test_any_single_bit_flip_is_a_wire_error(p: Packet, data: st.DataObject) -> None:
    raw = bytearray(encode(p))
    bit = data.draw(st.integers(0, 8 * len(raw) - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(WireError):
        decode(bytes(raw))


@given(st.binary(max_size=400))
def test_arbitrary_bytes_decode_or_raise_wire_error(data: bytes) -> None:
    with contextlib.suppress(WireError):
        assert isinstance(decode(data), Packet)


@given(packets(), st.integers(0, 200))
def test_truncated_or_extended_packets_are_rejected(p: Packet, cut: int) -> None:
    raw = encode(p)
    with pytest.raises(WireError):
        decode(raw[: max(0, len(raw) - 1 - cut)])
    with pytest.raises(WireError):
        decode(raw + b"\0" * (cut + 1))


@given(st.binary(max_size=20_000), st.integers(200, 1500))
def test_fragments_fit_the_datagram_and_rejoin(payload: bytes, mtu: int) -> None:
    template = Packet(sequence=7, modality=Modality.VIDEO_PATCHES, shape=(3, 4))
    parts = fragment(template, payload, mtu)
    assert all(len(encode(f)) <= mtu for f in parts)
    assert [f.fragment_index for f in parts] == list(range(len(parts)))
    assert {f.fragment_count for f in parts} == {len(parts)}
    assert b"".join(decode(encode(f)).payload for f in parts) == payload


def test_out_of_range_fields_are_refused_by_the_encoder() -> None:
    with pytest.raises(WireError, match="sequence"):
        encode(Packet(sequence=2**32))
    with pytest.raises(WireError, match="fragment 2 of 2"):
        encode(Packet(fragment_index=2, fragment_count=2))
    with pytest.raises(WireError, match="traceparent"):
        encode(Packet(traceparent="not-a-trace"))
    with pytest.raises(WireError, match="quant_scale"):
        encode(Packet(quant_scale=float("nan")))
    with pytest.raises(WireError, match="follows one 4 before"):
        encode(Packet(sequence=3, follows_back=4))


def test_resealed_packet_with_an_unknown_kind_is_a_wire_error() -> None:
    """A packet whose CRC is right but whose fields are not (a buggy sender) is still refused."""
    import google_crc32c

    raw = bytearray(encode(Packet()))
    raw[3] = 99  # kind
    body = bytes(raw[:-4])
    sealed = body + struct.pack("!I", google_crc32c.value(body))
    with pytest.raises(WireError, match="unknown enum"):
        decode(sealed)
    assert len(encode(Packet())) == OVERHEAD
    # A message said to follow one before the stream began.
    raw = bytearray(encode(Packet(sequence=3)))
    raw[16:18] = struct.pack("!H", 4)  # follows back
    body = bytes(raw[:-4])
    with pytest.raises(WireError, match="follows one 4 before"):
        decode(body + struct.pack("!I", google_crc32c.value(body)))


def test_small_fuzz_never_crashes() -> None:
    result = fuzz_decode(20_000, seed=1)
    assert result.crashes == 0, result.examples
    assert result.inputs == 20_000
    # The harness reaches both outcomes (re-sealed mutations decode; most inputs do not).
    assert result.packets > 500 and result.wire_errors > 10_000
