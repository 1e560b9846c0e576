"""The fused int8 decode kernels: same math as the eager ops, row-independent, and the fused
model decodes the same tokens alone, batched and under speculative verification."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from streamfuse.lm.gemma import GemmaModel, Segment
from streamfuse.lm.kernels import load_kernels
from streamfuse.lm.quant import Int8Linear
from streamfuse.testing.tiny_lm import tiny_model

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(
        (shutil.which("c++") is None and shutil.which("g++") is None)
        or shutil.which("ninja") is None,
        reason="no C++ compiler or ninja to build the kernels",
    ),
]

EPS = 1e-6


@pytest.fixture(scope="module")
def kern():  # type: ignore[no-untyped-def]
    k = load_kernels()
    assert k is not None, "a C++ compiler is present, so the kernels must build"
    return k


def eager_quant(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = h.abs().amax(-1, keepdim=True)
    return h.div(amax).mul_(127).round_().to(torch.int8), amax


def test_norm_quantize_matches_eager(kern) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    x, w = torch.randn(5, 64) * 3, torch.rand(64) + 0.5
    q, amax = kern.rms_norm_quantize(x, w, EPS)
    qe, ae = eager_quant(F.rms_norm(x, (64,), w, EPS))
    assert torch.allclose(amax, ae, rtol=1e-5)
    assert (q.int() - qe.int()).abs().max() <= 1  # ties may round either way
    q2, a2 = kern.quantize_rows(x)
    qe2, ae2 = eager_quant(x)
    assert torch.equal(q2, qe2) and torch.equal(a2, ae2)
    zero, za = kern.quantize_rows(torch.zeros(2, 8))
    assert not zero.any() and not za.any()


def test_residual_norm_and_geglu_match_eager(kern) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(1)
    x, y = torch.randn(3, 32), torch.randn(3, 48)
    w = torch.rand(32) + 0.5
    o = Int8Linear.from_float(torch.randn(32, 48) * 0.1)
    yq, ya = eager_quant(y)
    want = x + F.rms_norm(o(y), (32,), w, EPS)
    acc = torch._int_mm(yq, o._qweight_t)
    got = kern.add_rms_norm_acc(x.clone(), acc, ya, o._out_scale, w, EPS)
    assert torch.allclose(got, want, atol=1e-5)

    gu = Int8Linear.from_float(torch.randn(2 * 40, 32) * 0.1)
    hq, ha = eager_quant(x)
    gate, up = gu(x).chunk(2, dim=-1)
    qe, ae = eager_quant(F.gelu(gate, approximate="tanh") * up)
    q, a = kern.geglu_quantize_acc(torch._int_mm(hq, gu._qweight_t), ha, gu._out_scale)
    assert torch.allclose(a, ae, rtol=1e-5) and (q.int() - qe.int()).abs().max() <= 1


def test_qk_norm_rope_matches_eager(kern) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(2)
    H, KV, D, R = 4, 2, 16, 3
    lin = Int8Linear.from_float(torch.randn((H + 2 * KV) * D, 24) * 0.1)
    x = torch.randn(R, 24)
    mult, cos, sin = torch.rand(H + KV, D) + 0.5, torch.randn(R, D), torch.randn(R, D)
    qkv = lin(x)
    qk = F.rms_norm(qkv[:, : (H + KV) * D].view(R, H + KV, D), (D,), None, EPS) * mult
    qk = qk * cos[:, None] + torch.roll(qk, D // 2, dims=-1) * sin[:, None]
    xq, xa = eager_quant(x)
    got_qk, got_v = kern.qkv_norm_rope_acc(
        torch._int_mm(xq, lin._qweight_t), xa, lin._out_scale, mult, cos, sin, H, KV, D, EPS
    )
    assert torch.allclose(got_qk, qk, atol=1e-5)
    assert torch.allclose(got_v, qkv[:, (H + KV) * D :].view(R, KV, D), atol=1e-6)


def test_rows_do_not_depend_on_their_batch(kern) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(3)
    x, w = torch.randn(6, 40), torch.rand(40)
    both = kern.rms_norm_quantize(x, w, EPS)
    for i in range(6):
        one = kern.rms_norm_quantize(x[i : i + 1].clone(), w, EPS)
        assert torch.equal(one[0], both[0][i : i + 1]) and torch.equal(one[1], both[1][i : i + 1])


def test_fused_model_decodes_consistently(kern) -> None:  # type: ignore[no-untyped-def]
    base = tiny_model(seed=5, weights="int8")
    model = GemmaModel(base.config, base.weights, fused=True)
    eager = GemmaModel(base.config, base.weights, fused=False)
    assert model.fused and not eager.fused
    prompt = [2, 7, 11, 13, 17, 19]
    pool = model.kv_pool(num_slots=2, max_tokens=64)
    first = model.forward(torch.tensor(prompt), [Segment(0, 0, len(prompt))], pool)
    # Close to the eager path (int8 rounding of nearly equal values may differ by a step).
    eager_pool = eager.kv_pool(num_slots=2, max_tokens=64)
    ref = eager.forward(torch.tensor(prompt), [Segment(1, 0, len(prompt))], eager_pool)
    assert torch.allclose(first, ref, atol=0.05 * float(ref.abs().max()))
    # Greedy one token at a time == one verification pass over the same tokens.
    out = [int(first[-1].argmax())]
    for i in range(6):
        seg = [Segment(0, len(prompt) + i, 1)]
        out.append(int(model.forward(torch.tensor(out[-1:]), seg, pool, greedy=True)[0]))
    model.forward(torch.tensor(prompt), [Segment(1, 0, len(prompt))], pool)
    verify = model.forward(
        torch.tensor(out[:-1]), [Segment(1, len(prompt), len(out) - 1)], pool, greedy=True
    )
    assert verify.tolist() == out[1:]


def test_kv_write_and_greedy_head(kern) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(4)
    kc, vc = torch.zeros(3, 2, 10, 8), torch.zeros(3, 2, 10, 8)
    k, v = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    slot, pos = torch.tensor([0, 2, 2, 1]), torch.tensor([3, 0, 9, 5])
    kern.write_kv(kc, vc, k, v, slot, pos)
    want_k, want_v = torch.zeros_like(kc), torch.zeros_like(vc)
    want_k.permute(0, 2, 1, 3).index_put_((slot, pos), k)
    want_v.permute(0, 2, 1, 3).index_put_((slot, pos), v)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    with pytest.raises(RuntimeError, match="out of pool"):
        kern.write_kv(kc, vc, k[:1], v[:1], torch.tensor([3]), torch.tensor([0]))

    head = Int8Linear.from_float(torch.randn(50, 16))
    x = torch.randn(3, 16)
    acc, _ = head.accumulate(x)
    assert kern.argmax_scaled(acc, head.scale).tolist() == head(x).argmax(-1).tolist()


def test_int8_gemv_equals_int_mm_bit_for_bit(kern) -> None:  # type: ignore[no-untyped-def]
    if not kern.has_int8_gemv():
        pytest.skip("this build has neither AVX-512 VNNI nor AVX2: the model keeps torch._int_mm")
    torch.manual_seed(6)
    # The AVX2 form is exact for weights in [-127, 127] (what quantize_rows makes; the model
    # checks, test below); VNNI for every int8.
    low = -127 if kern.int8_gemv_isa() == "avx2" else -128
    # K off the vector (masked or scalar tail) and below it; N off the 4-row block; the int8
    # extremes (-128 shifts to 0 in VNNI's unsigned operand; in AVX2's it is the magnitude
    # 128, and 127 x 127 pairs the largest int16 sums); a strided activation view.
    for m, k, n in [(1, 640, 1536), (3, 100, 37), (8, 64, 4), (5, 7, 9), (9, 130, 70)]:
        w = torch.randint(low, 128, (n, k), dtype=torch.int8)
        w[0], w[-1] = low, 127
        x = torch.randint(-128, 128, (m, k + 3), dtype=torch.int8)[:, 2 : k + 2]
        x[0, :] = 127
        x[-1, :] = -128
        lin = Int8Linear(w, torch.ones(n))
        want = x.int() @ w.int().t()
        got = kern.int8_gemv(x, lin.qweight, lin.row_sums_128)
        assert got.dtype == torch.int32 and torch.equal(got, want), (m, k, n)
    with pytest.raises(RuntimeError, match="do not match"):
        kern.int8_gemv(x, w[:, 1:].contiguous(), lin.row_sums_128)


def test_gemv_and_int_mm_models_decode_the_same_tokens(kern) -> None:  # type: ignore[no-untyped-def]
    base = tiny_model(seed=7, weights="int8")
    fast = GemmaModel(base.config, base.weights, fused=True)
    plain = GemmaModel(base.config, base.weights, fused=True)
    plain.gemv_rows = plain.gemv_head_rows = 0  # every product through torch._int_mm
    if not kern.has_int8_gemv():
        assert fast.gemv_rows == fast.gemv_head_rows == 0
        pytest.skip("this build has neither AVX-512 VNNI nor AVX2: nothing to compare")
    isa = kern.int8_gemv_isa()
    assert fast.gemv_isa == isa
    assert (fast.gemv_rows, fast.gemv_head_rows) == (
        GemmaModel.GEMV_MAX_ROWS[isa],
        GemmaModel.GEMV_MAX_ROWS_HEAD[isa],
    )
    # 12 rows: with VNNI the layers take _int_mm, the head the compiled product (logits of
    # every row); with AVX2 every call takes the compiled product.
    prompt = list(range(3, 3 + 12))
    runs, verified = [], []
    for model in (fast, plain):
        pool = model.kv_pool(num_slots=2, max_tokens=64)
        first = model.forward(torch.tensor(prompt), [Segment(0, 0, len(prompt))], pool)
        logits = [first]
        for i in range(8):  # one row per step: the compiled product for layers and head
            seg = [Segment(0, len(prompt) + i, 1)]
            token = torch.tensor([int(logits[-1][-1].argmax())])
            logits.append(model.forward(token, seg, pool))
        runs.append(torch.cat(logits))
        # A 10-row greedy verification pass (the head alone on the compiled product).
        verified.append(model.forward(torch.arange(20, 30), [Segment(1, 0, 10)], pool, greedy=True))
    assert torch.equal(runs[0], runs[1])  # exact products: the same logits, bit for bit
    assert torch.equal(verified[0], verified[1])


def test_avx2_product_is_not_used_on_weights_holding_minus_128(kern) -> None:  # type: ignore[no-untyped-def]
    if kern.int8_gemv_isa() != "avx2":
        pytest.skip("the weight-range rule is the AVX2 product's")
    base = tiny_model(seed=7, weights="int8")
    assert GemmaModel(base.config, base.weights, fused=True).gemv_isa == "avx2"
    odd = tiny_model(seed=7, weights="int8")
    down = odd.weights.layers[1].down
    assert isinstance(down, Int8Linear) and down.symmetric
    down.qweight[0, 0] = -128  # a loaded weight outside what quantize_rows makes
    del down.symmetric  # the cached check, as a fresh Int8Linear would compute it
    model = GemmaModel(odd.config, odd.weights, fused=True)
    assert (model.gemv_isa, model.gemv_rows, model.gemv_head_rows) == ("", 0, 0)
