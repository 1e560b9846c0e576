"""The bundled Gemma 3 270M through the runtime: equal to transformers, int8 close to fp32,
speculative decoding identical to greedy. Slow: converts the GGUF once (about two minutes)."""

from __future__ import annotations

import pytest
import torch

from streamfuse.lm.config import LMConfig, ModelConfig
from streamfuse.lm.engine import LMEngine, Request
from streamfuse.lm.evaluate import perplexity, stream_nll
from streamfuse.lm.gemma import Segment
from streamfuse.lm.loader import bundled_gguf_path, load_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXT = (
    "The committee met on Tuesday to review the budget. After a long discussion, the members "
    "agreed to postpone the decision until the next quarter, when the new figures are known."
)


@pytest.fixture(scope="module")
def fp32():
    return load_model(ModelConfig(weights="fp32", threads=2))


@pytest.fixture(scope="module")
def int8():
    return load_model(ModelConfig(weights="int8", threads=2))


def _logits(model, ids: list[int]) -> torch.Tensor:
    pool = model.kv_pool(num_slots=1, max_tokens=len(ids))
    return model.forward(torch.tensor(ids), [Segment(0, 0, len(ids))], pool)


def test_fp32_logits_match_transformers(fp32) -> None:
    transformers = pytest.importorskip("transformers")
    model, tok = fp32
    ids = tok.encode("The capital of France is", add_bos=True)
    gguf = bundled_gguf_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert hf_tok(TEXT).input_ids == tok.encode(TEXT, add_bos=True)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    ours = _logits(model, ids)
    assert (ours - ref).abs().max().item() < 1e-3
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_int8_perplexity_close_to_fp32(fp32, int8) -> None:
    tok = int8[1]
    ids = tok.encode(TEXT * 3, add_bos=True)
    p32 = perplexity(stream_nll(fp32[0], ids, max_tokens=256))
    p8 = perplexity(stream_nll(int8[0], ids, max_tokens=256))
    assert p8 < p32 * 1.03


def test_speculative_quote_is_identical_to_greedy(int8) -> None:
    model, tok = int8
    prompt = f'Transcript: "{TEXT}"\nThe transcript, quoted exactly: "The committee'
    ids = tuple(tok.encode(prompt, add_bos=True))
    eng = LMEngine(model, LMConfig.model_validate({"pool": {"num_slots": 2, "max_tokens": 512}}))
    plain = eng.submit(Request(prompt_ids=ids, max_new_tokens=40, speculative=False, stop_ids=()))
    spec = eng.submit(Request(prompt_ids=ids, max_new_tokens=40, speculative=True, stop_ids=()))
    eng.run_until_idle()
    assert spec.tokens == plain.tokens
    assert eng.stats.accepted_drafts >= 20  # it really copied from the prompt
    assert "met on Tuesday" in tok.decode(spec.tokens)
