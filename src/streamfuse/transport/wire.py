"""The streamfuse wire format, version 3 (docs/wire-format.md): one packet per UDP datagram.

`encode(Packet) -> bytes` and `decode(bytes) -> Packet` are exact inverses; `decode` either
returns a packet whose CRC32C (over header and payload) matched, or raises `WireError` naming
what was wrong. It never raises anything else, whatever the bytes (fuzzed in tests/benchmarks).
"""

from __future__ import annotations

import enum
import re
import struct
from dataclasses import dataclass, field, replace

import google_crc32c

from streamfuse.errors import StreamfuseError

MAGIC = b"SF"
VERSION = 3
MAX_NDIM = 8
#: The largest payload one packet may carry (a UDP datagram holds at most 65507 bytes).
MAX_PAYLOAD = 65_000
_TRACEPARENT = re.compile(rb"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\Z")

# magic, version, kind, modality, dtype, flags, stream, sequence, follows back,
# media_time_us, fragment index, fragment count, quant scale, keep ratio (1e-4), mask bits,
# sample rate, ndim, traceparent length, payload length.
_FIXED = struct.Struct("!2sBBBBHIIHqHHfHIIBBI")
_CRC = struct.Struct("!I")
_F32_MAX = 3.4028234663852886e38
#: Bytes of a packet around its payload with no shape and no trace context.
OVERHEAD = _FIXED.size + _CRC.size


class WireError(StreamfuseError):
    """Bytes that are not a valid streamfuse packet (the message says why)."""


class Kind(enum.IntEnum):
    """What a packet is for."""

    DATA = 0  #: a fragment of a message (edge -> cloud)
    NACK = 1  #: fragments the receiver is missing (cloud -> edge)
    ACK = 2  #: a message completed, with receive counters (cloud -> edge)
    CONTROL = 3  #: stream open / end, JSON payload (edge -> cloud)
    #: the sender withdrew message `sequence` before all of it left: skip it (edge -> cloud)
    ABANDON = 4


class Modality(enum.IntEnum):
    """What a DATA message's payload holds."""

    NONE = 0
    VIDEO_PATCHES = 1  #: sparse patch tokens of a key frame (`streamfuse.transport.patches`)
    AUDIO_OPUS = 2  #: speech as Opus packets (`streamfuse.transport.speech`)
    TENSOR = 3  #: a raw tensor (shape/dtype/quant scale in the header)
    JSON = 4  #: a UTF-8 JSON document
    #: text lines the edge read itself from a key frame (`streamfuse.transport.textlines`)
    TEXT_LINES = 5


class DType(enum.IntEnum):
    """Element type of a TENSOR payload (NONE for coded payloads)."""

    NONE = 0
    UINT8 = 1
    INT8 = 2
    FLOAT8_E4M3 = 3
    FLOAT16 = 4
    FLOAT32 = 5
    INT16 = 6


@dataclass(frozen=True, slots=True)
class Packet:
    """One datagram. Integer fields are range-checked by `encode`."""

    kind: Kind = Kind.DATA
    stream: int = 0
    sequence: int = 0
    #: Deliver this message after message `sequence - follows_back`, the one before it in its
    #: lane (0: after nothing in particular); see `streamfuse.transport.udp`.
    follows_back: int = 0
    media_time_us: int = 0
    modality: Modality = Modality.NONE
    dtype: DType = DType.NONE
    shape: tuple[int, ...] = ()
    quant_scale: float = 1.0
    #: Share of the frame's patches kept, in [0, 1] (stored in 1/10000 steps).
    keep_ratio: float = 1.0
    mask_bits: int = 0
    sample_rate: int = 0
    fragment_index: int = 0
    fragment_count: int = 1
    flags: int = 0
    #: W3C trace context (`00-<trace id>-<span id>-<flags>`), or "" for none.
    traceparent: str = ""
    payload: bytes = field(default=b"", repr=False)


def _check(name: str, value: int, bits: int, signed: bool = False) -> None:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not lo <= value <= hi:
        raise WireError(f"{name}={value} does not fit {'i' if signed else 'u'}{bits}")


def encode(p: Packet) -> bytes:
    """The packet's bytes (raises `WireError` when a field is out of range)."""
    for name, value, bits in (
        ("stream", p.stream, 32),
        ("sequence", p.sequence, 32),
        ("follows_back", p.follows_back, 16),
        ("mask_bits", p.mask_bits, 32),
        ("sample_rate", p.sample_rate, 32),
        ("fragment_index", p.fragment_index, 16),
        ("fragment_count", p.fragment_count, 16),
        ("flags", p.flags, 16),
    ):
        _check(name, value, bits)
    _check("media_time_us", p.media_time_us, 64, signed=True)
    if p.follows_back > p.sequence:
        raise WireError(f"message {p.sequence} follows one {p.follows_back} before it")
    if p.fragment_count < 1 or p.fragment_index >= p.fragment_count:
        raise WireError(f"fragment {p.fragment_index} of {p.fragment_count} is impossible")
    if len(p.shape) > MAX_NDIM:
        raise WireError(f"tensor of {len(p.shape)} dimensions (at most {MAX_NDIM})")
    for d in p.shape:
        _check("shape dimension", d, 32)
    if not 0.0 <= p.keep_ratio <= 1.0:
        raise WireError(f"keep_ratio={p.keep_ratio} outside [0, 1]")
    trace = p.traceparent.encode("ascii", "replace")
    if trace and not _TRACEPARENT.match(trace):
        raise WireError(f"traceparent {p.traceparent!r} is not W3C version 00")
    if len(p.payload) > MAX_PAYLOAD:
        raise WireError(f"payload of {len(p.payload)} bytes (at most {MAX_PAYLOAD})")
    if not abs(p.quant_scale) <= _F32_MAX:  # also rejects NaN
        raise WireError(f"quant_scale={p.quant_scale} is not a finite float32")
    head = _FIXED.pack(
        MAGIC,
        VERSION,
        int(p.kind),
        int(p.modality),
        int(p.dtype),
        p.flags,
        p.stream,
        p.sequence,
        p.follows_back,
        p.media_time_us,
        p.fragment_index,
        p.fragment_count,
        p.quant_scale,
        round(p.keep_ratio * 10_000),
        p.mask_bits,
        p.sample_rate,
        len(p.shape),
        len(trace),
        len(p.payload),
    )
    body = head + struct.pack(f"!{len(p.shape)}I", *p.shape) + trace + p.payload
    return body + _CRC.pack(google_crc32c.value(body))


def decode(data: bytes) -> Packet:
    """The packet in `data`, or `WireError` saying why it is not one."""
    if len(data) < OVERHEAD:
        raise WireError(f"{len(data)} bytes is shorter than a header ({OVERHEAD})")
    if data[:2] != MAGIC:
        raise WireError(f"bad magic {bytes(data[:2])!r} (expected {MAGIC!r})")
    if data[2] != VERSION:
        raise WireError(f"wire version {data[2]} (this end speaks {VERSION})")
    (
        _,
        _,
        kind,
        modality,
        dtype,
        flags,
        stream,
        sequence,
        follows_back,
        media_time_us,
        frag_i,
        frag_n,
        scale,
        keep,
        mask_bits,
        rate,
        ndim,
        trace_len,
        payload_len,
    ) = _FIXED.unpack_from(data)
    if ndim > MAX_NDIM:
        raise WireError(f"tensor of {ndim} dimensions (at most {MAX_NDIM})")
    expected = _FIXED.size + 4 * ndim + trace_len + payload_len + _CRC.size
    if len(data) != expected:
        raise WireError(f"{len(data)} bytes where the header announces {expected}")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if google_crc32c.value(bytes(data[: -_CRC.size])) != crc:
        raise WireError("CRC32C mismatch (corrupted packet)")
    # Past the CRC the bytes are as sent, but a buggy or hostile sender may still lie.
    try:
        kind_, modality_, dtype_ = Kind(kind), Modality(modality), DType(dtype)
    except ValueError as e:
        raise WireError(f"unknown enum value: {e}") from e
    if frag_n < 1 or frag_i >= frag_n:
        raise WireError(f"fragment {frag_i} of {frag_n} is impossible")
    if follows_back > sequence:
        raise WireError(f"message {sequence} follows one {follows_back} before it")
    if not abs(scale) <= _F32_MAX:
        raise WireError(f"quant scale {scale} is not finite")
    if keep > 10_000:
        raise WireError(f"keep ratio {keep / 10_000} above 1")
    offset = _FIXED.size
    shape = struct.unpack_from(f"!{ndim}I", data, offset)
    offset += 4 * ndim
    trace = bytes(data[offset : offset + trace_len])
    if trace and not _TRACEPARENT.match(trace):
        raise WireError("traceparent is not W3C version 00")
    offset += trace_len
    return Packet(
        kind=kind_,
        stream=stream,
        sequence=sequence,
        follows_back=follows_back,
        media_time_us=media_time_us,
        modality=modality_,
        dtype=dtype_,
        shape=tuple(shape),
        quant_scale=scale,
        keep_ratio=keep / 10_000,
        mask_bits=mask_bits,
        sample_rate=rate,
        fragment_index=frag_i,
        fragment_count=frag_n,
        flags=flags,
        traceparent=trace.decode("ascii"),
        payload=bytes(data[offset : offset + payload_len]),
    )


def fragment(template: Packet, payload: bytes, max_datagram: int) -> list[Packet]:
    """`payload` split into packets of at most `max_datagram` bytes each, all copying
    `template`'s header fields (fragment index/count set)."""
    room = max_datagram - OVERHEAD - 4 * len(template.shape) - len(template.traceparent)
    if room < 64:
        raise WireError(f"datagram size {max_datagram} leaves {room} payload bytes (< 64)")
    chunks = [payload[i : i + room] for i in range(0, len(payload), room)] or [b""]
    if len(chunks) > 0xFFFF:
        raise WireError(f"message of {len(payload)} bytes needs {len(chunks)} fragments")
    return [
        replace(template, fragment_index=i, fragment_count=len(chunks), payload=chunk)
        for i, chunk in enumerate(chunks)
    ]


__all__ = [
    "MAGIC",
    "OVERHEAD",
    "VERSION",
    "DType",
    "Kind",
    "Modality",
    "Packet",
    "WireError",
    "decode",
    "encode",
    "fragment",
]
