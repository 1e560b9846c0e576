"""Language-model runtime vs Hugging Face transformers, side by side in one run.

Same model (the bundled Gemma 3 270M GGUF), same prompts, same torch thread count:
  baseline   transformers `generate()` (greedy, default cache) on the GGUF dequantized to fp32,
             in a subprocess so its memory does not count against ours;
  single     our engine, one stream, greedy, speculation off;
  batch8     8 concurrent streams through the continuous-batching engine (aggregate tokens/s);
  spec       prompt-lookup speculative decoding on a copy-heavy task (quoting a transcript):
             tokens/s over plain greedy on the same prompt, and whether the outputs are identical;
  stream     a 20,000-token session (6,000 with --quick) fed through a 2048-token slot (sink +
             window truncation), asking a question every 2,500 tokens: peak RSS and RSS growth;
  ppl        continuation perplexity with sink + window vs the full context, same text;
  cancel     from `cancel()` to the slot being free, against one decode step;
  memory     model weights and KV pool bytes.
The machine is usually shared, so every timing is the best of a few interleaved rounds (other
jobs only ever slow a run down). The last line is one JSON object: baseline_tok_s,
single_tok_s, batch8_tok_s, spec_speedup, spec_identical, peak_rss_mb, cancel_to_free_ms
(plus a few more keys after those), and the machine: `cpu`, `cpu_features` (avx2 / avx512f /
avx512_vnni / amx flags from /proc/cpuinfo) and `kernel_path` (fused kernels or eager ops,
ATen's ISA, which int8 products ran on the compiled kernel, AVX-512 VNNI or AVX2, and the
oneDNN ISA and primitive the other int8 products ran on).

    python benchmarks/lm.py [--quick] [--threads 2] [--skip-baseline] [--smooth-alpha A]
        [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.lm")

PROMPTS = [
    "The history of the printing press begins",
    "In a small village at the edge of the forest, there lived",
    "The main advantages of renewable energy are",
    "To make a good cup of coffee, you need",
    "The meeting notes from Tuesday: the team agreed that",
    "Photosynthesis is the process by which",
    "The first rule of writing clear documentation is",
    "When the train finally arrived at the station,",
]

TRANSCRIPT = (
    "Okay, let's get started. Today we are going to review the results of the spring pilot. "
    "We ran the new onboarding flow with three hundred customers in four regions. The "
    "completion rate went from sixty-one percent to seventy-eight percent, and the number of "
    "support tickets in the first week dropped by about a third. The biggest improvement came "
    "from the shorter sign-up form and the guided tour on the dashboard. On the other hand, "
    "the mobile numbers were weaker: completion on phones only improved by five points, "
    "mostly because the tour does not fit small screens. So the proposal is to ship the new "
    "flow to everyone on desktop next Monday, and to redesign the tour for mobile before we "
    "roll it out there. Maria will own the mobile redesign, and Tom will prepare the release "
    "notes. Any questions before we move on to the budget?"
)
SPEC_PROMPT = (
    "Meeting transcript (speaker: product lead):\n\n"
    f'"{TRANSCRIPT}"\n\n'
    "The same transcript, quoted word for word for the minutes:\n\n"
    "\"Okay, let's get started."
)


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# -- baseline (runs in a subprocess) -----------------------------------------------------------
def hf_model_dir() -> Path:
    """The bundled GGUF as a Hugging Face fp32 folder (converted once, then loads in seconds)."""
    from streamfuse.lm.loader import bundled_gguf_path
    from streamfuse.models import cache_dir

    out = cache_dir() / "lm" / "hf-gemma-3-270m-fp32"
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf_path()
    log.info("converting the GGUF for transformers once (about a minute)")
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    model.config.quantization_config = None
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    return out


def baseline_worker(spec_path: Path) -> None:
    """Subprocess entry: transformers generate() on the prompts; prints one JSON object."""
    job = json.loads(spec_path.read_text())
    import torch

    torch.set_num_threads(job["threads"])
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(hf_model_dir()), dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    n = job["max_new"]
    outs: list[list[int]] = []
    times = [float("inf")] * len(job["prompts"])
    with torch.inference_mode():
        model.generate(torch.tensor([job["prompts"][0]]), max_new_tokens=4, do_sample=False)
        for _ in range(job["rounds"]):
            outs = []
            for i, ids in enumerate(job["prompts"]):
                x = torch.tensor([ids])
                t = time.perf_counter()
                y = model.generate(
                    x, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
                )
                times[i] = min(times[i], time.perf_counter() - t)
                outs.append(y[0, len(ids) :].tolist())
    print(
        json.dumps(
            {
                "tok_s": n * len(times) / sum(times),
                "load_s": load_s,
                "outputs": outs,
                "peak_rss_mb": _peak_rss_mb(),
            }
        )
    )


def run_baseline(
    prompts: list[list[int]], max_new: int, threads: int, rounds: int
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        job = {"prompts": prompts, "max_new": max_new, "threads": threads, "rounds": rounds}
        json.dump(job, f)
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--baseline-worker", f.name],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        raise RuntimeError(f"baseline worker failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# -- ours --------------------------------------------------------------------------------------
def make_engine(model: Any, slots: int, max_tokens: int = 2048, **over: Any) -> Any:
    from streamfuse.lm.config import LMConfig
    from streamfuse.lm.engine import LMEngine

    cfg = {"pool": {"num_slots": slots, "max_tokens": max_tokens}, **over}
    return LMEngine(model, LMConfig.model_validate(cfg))


def bench_single(model: Any, prompts: list[list[int]], max_new: int, rounds: int) -> dict[str, Any]:
    """One stream at a time: plain greedy (speculation off), and the engine's default (prompt
    lookup on, same tokens) on the same ordinary prompts, interleaved."""
    from streamfuse.lm.engine import Request

    eng = make_engine(model, 1, 512)
    eng.generate(prompts[0], 4, speculative=False, stop_ids=())  # warm-up
    outs: dict[bool, list[list[int]]] = {False: [], True: []}
    best = {spec: [float("inf")] * len(prompts) for spec in (False, True)}
    for _ in range(rounds):
        outs = {False: [], True: []}
        for i, ids in enumerate(prompts):
            for spec in (False, True):
                req = Request(
                    prompt_ids=tuple(ids), max_new_tokens=max_new, speculative=spec, stop_ids=()
                )
                t = time.perf_counter()
                outs[spec].append(eng.submit(req).wait())
                best[spec][i] = min(best[spec][i], time.perf_counter() - t)
    n = max_new * len(prompts)
    return {
        "tok_s": n / sum(best[False]),
        "default_spec_tok_s": n / sum(best[True]),
        "default_spec_identical": outs[True] == outs[False],
        "outputs": outs[False],
    }


def bench_batch(model: Any, prompts: list[list[int]], max_new: int, rounds: int) -> dict[str, Any]:
    from streamfuse.lm.engine import Request

    eng = make_engine(model, len(prompts), 512)
    eng.generate(prompts[0], 4, speculative=False, stop_ids=())
    best = float("inf")
    outs: list[list[int]] = []
    for _ in range(rounds):
        t = time.perf_counter()
        handles = [
            eng.submit(
                Request(prompt_ids=tuple(p), max_new_tokens=max_new, speculative=False, stop_ids=())
            )
            for p in prompts
        ]
        eng.run_until_idle()
        best = min(best, time.perf_counter() - t)
        outs = [h.tokens for h in handles]
    return {"tok_s": sum(len(o) for o in outs) / best, "streams": len(prompts), "outputs": outs}


def bench_spec(model: Any, tok: Any, max_new: int, rounds: int) -> dict[str, Any]:
    from streamfuse.lm.engine import Request

    ids = tok.encode(SPEC_PROMPT, add_bos=True)
    eng = make_engine(model, 1, 1024)
    eng.generate(ids[:16], 4, speculative=True, stop_ids=())
    res: dict[str, Any] = {}
    for spec in (False, True) * rounds:  # interleaved, best of `rounds` each
        before = (eng.stats.steps, eng.stats.draft_tokens, eng.stats.accepted_drafts)
        t = time.perf_counter()
        out = eng.submit(
            Request(prompt_ids=tuple(ids), max_new_tokens=max_new, speculative=spec, stop_ids=())
        ).wait()
        dt = time.perf_counter() - t
        key = "spec" if spec else "plain"
        if key not in res or dt < res[key]["wall_s"]:
            res[key] = {
                "wall_s": dt,
                "out": out,
                "steps": eng.stats.steps - before[0],
                "drafted": eng.stats.draft_tokens - before[1],
                "accepted": eng.stats.accepted_drafts - before[2],
            }
    plain, spec_r = res["plain"], res["spec"]
    return {
        "plain_tok_s": max_new / plain["wall_s"],
        "spec_tok_s": max_new / spec_r["wall_s"],
        "speedup": plain["wall_s"] / spec_r["wall_s"],
        "identical": plain["out"] == spec_r["out"],
        "acceptance": spec_r["accepted"] / max(1, spec_r["drafted"]),
        "tokens_per_step": max_new / max(1, spec_r["steps"]),
        "prompt_tokens": len(ids),
        "text": tok.decode(spec_r["out"])[:300],
    }


def corpus_ids(tok: Any, n: int) -> list[int]:
    """n tokens of natural English text (Python's bundled documentation topics)."""
    from pydoc_data.topics import topics

    ids: list[int] = [tok.bos_id]
    for key in sorted(topics):
        ids.extend(tok.encode(topics[key] + "\n\n"))
        if len(ids) >= n:
            break
    return ids[:n]


def bench_stream(model: Any, tok: Any, total: int, ask_every: int) -> dict[str, Any]:
    from streamfuse.lm.engine import Request

    eng = make_engine(model, 2, 2048)
    ids = corpus_ids(tok, total)
    question = tuple(tok.encode("\n\nIn one sentence, the text above is about"))
    rss: list[tuple[int, float]] = []
    answers = []
    t = time.perf_counter()
    chunk = 256
    for i in range(0, len(ids), chunk):
        eng.feed("stream", ids[i : i + chunk]).wait()
        fed = i + chunk
        if fed % ask_every < chunk:
            req = Request(prompt_ids=question, max_new_tokens=12, session="stream", stop_ids=())
            answers.append(tok.decode(eng.submit(req).wait()))
            rss.append((fed, _rss_mb()))
    wall = time.perf_counter() - t
    return {
        "tokens": len(ids),
        "wall_s": wall,
        "prefill_tok_s": len(ids) / wall,
        "rss_mb_by_tokens": rss,
        "rss_growth_mb": rss[-1][1] - rss[0][1] if len(rss) > 1 else 0.0,
        "truncations": eng.stats.truncations,
        "slot_tokens": len(eng.session_context("stream")),
        "pool_mb": eng.pool.nbytes / 2**20,
        "last_answer": answers[-1] if answers else "",
    }


def bench_ppl(model: Any, tok: Any, n: int, small_slot: int) -> dict[str, Any]:
    from streamfuse.lm.evaluate import perplexity, stream_nll

    ids = corpus_ids(tok, n)
    full = stream_nll(model, ids, max_tokens=n + 64, chunk=128)
    window = stream_nll(model, ids, max_tokens=small_slot, sink_tokens=4, chunk=64)
    # Compare on the continuation past the small slot, where truncation is in effect.
    tail = slice(small_slot, None)
    p_full, p_win = perplexity(full[tail]), perplexity(window[tail])
    return {
        "tokens": n,
        "slot_tokens": small_slot,
        "ppl_full": p_full,
        "ppl_sink_window": p_win,
        "ratio": p_win / p_full,
        "ppl_full_all": perplexity(full),
    }


def bench_cancel(model: Any, trials: int) -> dict[str, Any]:
    """Time from cancel() (another thread, mid-step) to the slot being back in the pool."""
    from streamfuse.lm.engine import Request

    eng = make_engine(model, 2, 512, speculative={"enabled": False})
    eng.start()
    lat_ms = []
    try:
        for i in range(trials):
            h = eng.submit(
                Request(prompt_ids=(2, 651, 1234 + i), max_new_tokens=10_000, stop_ids=())
            )
            while len(h.tokens) < 3:
                time.sleep(0.001)
            time.sleep(0.013 * (i % 3))  # land at different points inside a step
            free_before = eng.pool.num_free
            t = time.perf_counter()
            h.cancel()
            while eng.pool.num_free == free_before:
                pass
            lat_ms.append((time.perf_counter() - t) * 1000)
    finally:
        eng.stop()
    step_ms = 1000 * eng.stats.forward_s / max(1, eng.stats.steps)
    return {"median_ms": statistics.median(lat_ms), "max_ms": max(lat_ms), "step_ms": step_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller run, under 3 minutes")
    ap.add_argument("--threads", type=int, default=2, help="torch threads, ours and baseline")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument(
        "--smooth-alpha",
        type=float,
        default=None,
        help="int8 activation-outlier smoothing (ModelConfig.smooth_alpha; default the "
        "engine's; 0: plain per-row int8). Same shapes and kernels either way.",
    )
    ap.add_argument("--out", type=Path, help="also write the full results as JSON here")
    ap.add_argument("--baseline-worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.baseline_worker:
        baseline_worker(args.baseline_worker)
        return

    import torch

    from streamfuse.lm.config import ModelConfig
    from streamfuse.lm.kernels import cpu_features, kernel_path
    from streamfuse.lm.loader import load_model
    from streamfuse.testing.machine import cpu_description

    q = args.quick
    max_new = 32 if q else 128
    n_prompts = 3 if q else 4
    rounds = 2
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    mcfg = ModelConfig(weights="int8", threads=args.threads)
    if args.smooth_alpha is not None:
        mcfg = mcfg.model_copy(update={"smooth_alpha": args.smooth_alpha})
    model, tok = load_model(mcfg)
    assert tok is not None
    load_s = time.perf_counter() - t0
    rss_model = _rss_mb()
    results: dict[str, Any] = {"threads": args.threads, "quick": q, "load_s": load_s}
    # A figure only holds on the ISA it ran on (AVX2 vs AVX-512 VNNI vs AMX): name both the
    # CPU's features and the code paths that actually ran.
    machine = {
        "cpu": cpu_description(),
        "cpu_features": cpu_features(),
        "kernel_path": kernel_path(model.fused, model.gemv_rows, model.gemv_isa),
    }
    log.info("machine: %s", json.dumps(machine))
    results.update(machine)
    prompts = [tok.encode(p, add_bos=True) for p in PROMPTS]

    def phase(name: str) -> None:
        log.info("[%6.1f s] %s", time.perf_counter() - t0, name)

    # The 20k stream first, so the peak RSS is the stream's (model + its pool), not the batch's.
    phase("stream")
    results["stream"] = bench_stream(model, tok, 6000 if q else 20_000, 1500 if q else 2500)
    results["peak_rss_mb"] = _peak_rss_mb()
    results["rss_after_load_mb"] = rss_model
    phase("single")
    results["single"] = bench_single(model, prompts[:n_prompts], max_new, rounds)
    phase("batch8")
    results["batch8"] = bench_batch(model, prompts[:8], max_new, rounds)
    phase("spec")
    results["spec"] = bench_spec(model, tok, 64 if q else 192, rounds)
    phase("ppl")
    # Quick: a 256-token slot over 1,024 tokens; full: the default 2048-token slot over 4,096.
    results["ppl"] = bench_ppl(model, tok, 1024 if q else 4096, 256 if q else 2048)
    phase("cancel")
    results["cancel"] = bench_cancel(model, 8 if q else 20)
    results["memory"] = {
        "weights_mb": model.weights.nbytes() / 2**20,
        "pool_16x2048_mb": make_engine(model, 16, 2048).pool.nbytes / 2**20,
    }
    if not args.skip_baseline:
        phase("baseline (transformers generate, subprocess)")
        base = run_baseline(prompts[:n_prompts], max_new, args.threads, rounds)
        agree = []
        for a, b in zip(base.pop("outputs"), results["single"]["outputs"], strict=True):
            same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
            agree.append(same)
        base["tokens_equal_before_divergence"] = agree
        results["baseline"] = base
    phase("done")
    for r in ("single", "batch8"):
        results[r].pop("outputs", None)

    single = results["single"]["tok_s"]
    baseline = results.get("baseline", {}).get("tok_s")
    summary = {
        "baseline_tok_s": round(baseline, 2) if baseline else None,
        "single_tok_s": round(single, 2),
        "batch8_tok_s": round(results["batch8"]["tok_s"], 2),
        "spec_speedup": round(results["spec"]["speedup"], 2),
        "spec_identical": results["spec"]["identical"],
        "peak_rss_mb": round(results["peak_rss_mb"], 1),
        "cancel_to_free_ms": round(results["cancel"]["median_ms"], 3),
        "single_vs_baseline": round(single / baseline, 2) if baseline else None,
        "batch8_vs_single": round(results["batch8"]["tok_s"] / single, 2),
        "ppl_ratio_sink_window": round(results["ppl"]["ratio"], 3),
        "single_default_spec_tok_s": round(results["single"]["default_spec_tok_s"], 2),
        "decode_step_ms": round(results["cancel"]["step_ms"], 1),
        "stream_tokens": results["stream"]["tokens"],
        "threads": args.threads,
        "smooth_alpha": mcfg.smooth_alpha,
        **machine,
    }
    detail = json.dumps(results, indent=1, default=str)
    print(detail, file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
