"""A fuzz harness for the wire codec: random bytes, mutated valid packets, and mutated packets
re-sealed with a correct CRC (so field validation behind the checksum is exercised too).

`fuzz_decode(n)` feeds `n` inputs to `decode` and counts outcomes; anything but a `Packet` or a
`WireError` is a crash (kept, with its input, for the report).
"""

from __future__ import annotations

import json
import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import google_crc32c

from streamfuse.transport.wire import DType, Kind, Modality, Packet, WireError, decode, encode


@dataclass
class FuzzResult:
    inputs: int = 0
    packets: int = 0
    wire_errors: int = 0
    crashes: int = 0
    #: The first few crashing inputs with the exception raised.
    examples: list[tuple[bytes, str]] = field(default_factory=list)


def _valid(rng: random.Random) -> bytes:
    ndim = rng.randrange(0, 4)
    trace = ""
    if rng.random() < 0.5:
        trace = f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01"
    n = rng.randrange(1, 5)
    return encode(
        Packet(
            kind=rng.choice(list(Kind)),
            stream=rng.getrandbits(32),
            sequence=rng.getrandbits(32),
            media_time_us=rng.getrandbits(63),
            modality=rng.choice(list(Modality)),
            dtype=rng.choice(list(DType)),
            shape=tuple(rng.randrange(0, 5000) for _ in range(ndim)),
            quant_scale=rng.random(),
            keep_ratio=rng.random(),
            mask_bits=rng.getrandbits(20),
            sample_rate=rng.choice([0, 16000, 48000]),
            fragment_index=rng.randrange(n),
            fragment_count=n,
            traceparent=trace,
            payload=rng.randbytes(rng.randrange(0, 300)),
        )
    )


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    op = rng.randrange(5)
    if op == 0 and b:  # flip bits
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif op == 1:  # truncate
        del b[rng.randrange(len(b) + 1) :]
    elif op == 2:  # extend
        b += rng.randbytes(rng.randrange(1, 16))
    elif op == 3 and b:  # overwrite a run with random bytes
        i = rng.randrange(len(b))
        b[i : i + 4] = rng.randbytes(4)
    else:  # splice two packets
        b = b[: rng.randrange(len(b) + 1)] + bytearray(_valid(rng))
    return bytes(b)


def _reseal(data: bytes) -> bytes:
    """`data` with its last 4 bytes replaced by the CRC32C of the rest."""
    if len(data) < 5:
        return data
    body = data[:-4]
    return body + struct.pack("!I", google_crc32c.value(body))


def fuzz_inputs(rng: random.Random) -> bytes:
    """One fuzz input."""
    r = rng.random()
    if r < 0.2:
        return rng.randbytes(rng.randrange(0, 200))
    if r < 0.6:
        return _mutate(rng, _valid(rng))
    return _reseal(_mutate(rng, _valid(rng)))


def _fuzz(
    n: int, seed: int, inputs: Callable[[random.Random], bytes], decoder: Callable[[bytes], object]
) -> FuzzResult:
    """Feed `n` inputs drawn by `inputs` to `decoder`; count decodes, codec errors, crashes."""
    rng = random.Random(seed)
    result = FuzzResult()
    for _ in range(n):
        data = inputs(rng)
        result.inputs += 1
        try:
            decoder(data)
            result.packets += 1
        except WireError:
            result.wire_errors += 1
        except Exception as e:  # anything else is the bug this harness looks for
            result.crashes += 1
            if len(result.examples) < 5:
                result.examples.append((data, repr(e)))
    return result


def fuzz_decode(n: int, seed: int = 0) -> FuzzResult:
    """Decode `n` fuzz inputs; count packets, codec errors and crashes."""
    return _fuzz(n, seed, fuzz_inputs, decode)


def _text_lines_body(rng: random.Random) -> dict[str, object]:
    w, h = rng.randrange(1, 4000), rng.randrange(1, 3000)

    def box() -> list[int]:
        x0, y0 = rng.randrange(w), rng.randrange(h)
        return [x0, y0, rng.randrange(x0, w + 1), rng.randrange(y0, h + 1)]

    return {
        "i": rng.randrange(1 << 20),
        "t": rng.random() * 100,
        "w": w,
        "h": h,
        "tc": rng.random() * 100,
        "r": rng.choice(["first", "change", "timeout", "end"]),
        "ch": box(),
        "ms": rng.random() * 1000,
        "det": rng.choice([640, 960, 1280]),
        "l": [
            [
                "".join(rng.choice("abc xyz0ü") for _ in range(rng.randrange(0, 30))),
                box(),
                rng.random(),
            ]
            for _ in range(rng.randrange(0, 8))
        ],
    }


def text_lines_inputs(rng: random.Random) -> bytes:
    """One fuzz input for the TEXT_LINES payload codec: random bytes, a valid payload
    mutated, or a valid body's JSON text mutated and deflated again (past the deflate check,
    so the field checks behind it are exercised)."""
    r = rng.random()
    if r < 0.2:
        return rng.randbytes(rng.randrange(0, 300))
    text = json.dumps(_text_lines_body(rng)).encode()
    if r < 0.6:
        return _mutate_bytes(rng, zlib.compress(text))
    return zlib.compress(_mutate_bytes(rng, text))


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    op = rng.randrange(4)
    if op == 0 and b:
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif op == 1:
        del b[rng.randrange(len(b) + 1) :]
    elif op == 2:
        b += rng.randbytes(rng.randrange(1, 16))
    elif b:
        i = rng.randrange(len(b))
        b[i : i + 4] = rng.randbytes(4)
    return bytes(b)


def fuzz_text_lines(n: int, seed: int = 0) -> FuzzResult:
    """Decode `n` fuzz inputs as TEXT_LINES payloads (`transport.textlines`); `packets` counts
    the payloads decoded, `wire_errors` those refused."""
    from streamfuse.transport.textlines import decode_text_lines

    return _fuzz(
        n,
        seed,
        text_lines_inputs,
        lambda data: decode_text_lines(data, stream_id="fuzz", arrival_wall=0.0),
    )


__all__ = ["FuzzResult", "fuzz_decode", "fuzz_inputs", "fuzz_text_lines", "text_lines_inputs"]
