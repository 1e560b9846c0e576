"""What machine a benchmark ran on: CPU model, visible cores and the SIMD extensions that
change model speed (a figure from an AVX2-only CPU does not hold on one with AMX)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile")


def cpu_description() -> str:
    model, flags = platform.processor() or "unknown", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    isa = " ".join(f for f in ISA_FLAGS if f in flags) or "-"
    return f"{model}, {os.cpu_count()} cores visible, {platform.machine()} [{isa}]"
