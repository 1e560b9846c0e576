"""What `benchmarks/lm.py` reports about the machine: CPU features from /proc/cpuinfo and the
int8 product's oneDNN path, parsed from the texts those come from."""

from __future__ import annotations

import pytest

from streamfuse.lm.kernels import (
    CPU_FEATURES,
    EVERY_CALL,
    cpu_features,
    kernel_path,
    parse_onednn_log,
)

pytestmark = pytest.mark.unit

CPUINFO = """processor\t: 0
model name\t: Some CPU
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_vnni amx_tile amx_int8
processor\t: 1
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_vnni amx_tile amx_int8
"""

ONEDNN_LOG = """onednn_verbose,v1,info,oneDNN v3.12.0 (commit 80afa71)
onednn_verbose,v1,info,cpu,runtime:OpenMP,nthr:2
onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with AMX
onednn_verbose,v1,primitive,exec,cpu,gemm_api,,undef,src_s8::blocked:ab:f0,,,64x640:640x1024,65.5
onednn_verbose,v1,primitive,exec,cpu,brg_matmul:avx512_core_amx,,undef,src_s8,,,1x640,1.0
"""


def test_cpu_features_reads_the_flags_line() -> None:
    feats = cpu_features(CPUINFO)
    assert set(feats) == set(CPU_FEATURES)
    assert feats["avx512_vnni"] and feats["amx_int8"] and feats["avx2"]
    assert not feats["avx512_bf16"] and not feats["avx_vnni"]


def test_cpu_features_without_flags_is_all_false() -> None:
    assert not any(cpu_features("model name: x\n").values())


def test_onednn_log_names_isa_and_the_first_primitive() -> None:
    assert parse_onednn_log(ONEDNN_LOG) == {"isa": "Intel AVX-512 with AMX", "impl": "gemm_api"}
    assert parse_onednn_log("nothing here") == {}


def test_kernel_path_names_the_layer_path() -> None:
    path = kernel_path(False)
    assert path["layers"] == "eager torch ops"
    assert path["aten_isa"]
    assert path["int8_gemv"] == "not used"
    assert kernel_path(True, 8, "avx512_vnni")["int8_gemv"] == (
        "compiled AVX-512 VNNI, calls of <= 8 rows"
    )
    assert kernel_path(True, EVERY_CALL, "avx2")["int8_gemv"] == "compiled AVX2, every call"
    # The probe names what computed the int8 product: a oneDNN primitive with the ISA oneDNN
    # chose (VNNI / AMX machines), or ATen's own kernel (AVX2-only machines: oneDNN logs none).
    gemm = path["int8_gemm"]
    assert gemm.get("impl"), gemm
    assert ("isa" in gemm) == (not gemm["impl"].startswith("ATen")), gemm
