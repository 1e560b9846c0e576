"""F19 rescheduling: a question's time to first token while other streams' work keeps the LM
busy, with the hit-rate-triggered rescheduling on and off, side by side in one run.

The bundled Gemma 3 270M (int8) in one engine on its background thread. `--streams` background
workers each submit, one after another, a fresh `--doc-tokens` document to note on (priority
0, `--note-tokens` generated): nothing of it is cached, so the KV-cache hit rate stays low, the
regime where rescheduling is on. Meanwhile the main thread asks `--questions` questions
(priority 1, a fresh `--question-tokens` context each, `--answer-tokens` generated), one every
`--gap-s`, and times each one's first token. The phases alternate between the two configs
(`--rounds` each) on the same loaded model, so both see the same machine; every phase records
question TTFT, the background work done (documents and prompt tokens per second) and the
scheduler's counters. Prints the CPU, a table, and one JSON line: `ttft_p50_ms_on`,
`ttft_p95_ms_on`, `ttft_p50_ms_off`, `ttft_p95_ms_off`, `ttft_p95_ratio_off_over_on`,
`background_tok_s_on`, `background_tok_s_off`, `rescheduled_steps_on`, `hit_rate_on`.

    python benchmarks/lm_reschedule.py [--streams 3] [--questions 12] [--rounds 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from importlib import resources
from typing import Any

from streamfuse.stats import percentiles


def texts(tok: Any, n_tokens: int, count: int, offset: int) -> list[tuple[int, ...]]:
    """`count` distinct windows of `n_tokens` ids from the generic text shipped with the LM."""
    corpus = resources.files("streamfuse.lm").joinpath("calibration.txt").read_text()
    ids = tok.encode(corpus)
    out = []
    for i in range(count):
        start = (offset + i * 97) % max(1, len(ids) - n_tokens)
        out.append(tuple(ids[start : start + n_tokens]))
    return out


def phase(model: Any, tok: Any, args: argparse.Namespace, reschedule: bool, seed: int) -> dict:
    from streamfuse.lm.config import LMConfig
    from streamfuse.lm.engine import LMEngine
    from streamfuse.lm.request import Request

    config = LMConfig.model_validate(
        {
            "pool": {"num_slots": args.streams + 2, "max_tokens": 1024},
            "scheduler": {"reschedule": reschedule},
        }
    )
    engine = LMEngine(model, config)
    engine.start()
    stop = threading.Event()
    done = [0] * args.streams
    docs = texts(tok, args.doc_tokens, 64, offset=seed * 1009)

    def background(worker: int) -> None:
        i = worker
        while not stop.is_set():
            req = Request(
                prompt_ids=docs[i % len(docs)] + tuple(tok.encode("\nNotes:")),
                max_new_tokens=args.note_tokens,
                stop_ids=(),
            )
            engine.submit(req).wait()
            done[worker] += 1
            i += args.streams

    workers = [threading.Thread(target=background, args=(w,)) for w in range(args.streams)]
    for w in workers:
        w.start()
    time.sleep(args.gap_s)  # the background is running before the first question
    questions = texts(tok, args.question_tokens, args.questions, offset=seed * 2003 + 500)
    ttft: list[float] = []
    t0 = time.perf_counter()
    base = engine.stats.prefill_tokens
    for q in questions:
        req = Request(
            prompt_ids=q + tuple(tok.encode("\nQuestion: what is this about?\nAnswer:")),
            max_new_tokens=args.answer_tokens,
            priority=1,
            stop_ids=(),
        )
        handle = engine.submit(req)
        handle.wait()
        assert handle.first_token_wall is not None
        ttft.append((handle.first_token_wall - handle.submitted_wall) * 1e3)
        time.sleep(args.gap_s)
    wall = time.perf_counter() - t0
    stop.set()
    for w in workers:
        w.join()
    engine.stop()
    question_prefill = len(questions) * (args.question_tokens + 12)
    stats = engine.stats
    return {
        "reschedule": reschedule,
        "ttft_ms": ttft,
        "documents": sum(done),
        "background_tok_s": (stats.prefill_tokens - base - question_prefill) / wall,
        "rescheduled_steps": stats.rescheduled_steps,
        "deferred_chunks": stats.deferred_chunks,
        "hit_rate": engine.scheduler.hit_rate.rate,
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=3, help="background workers")
    ap.add_argument("--questions", type=int, default=12, help="questions per phase")
    ap.add_argument("--rounds", type=int, default=2, help="phases per config (interleaved)")
    ap.add_argument("--doc-tokens", type=int, default=384)
    ap.add_argument("--note-tokens", type=int, default=16)
    ap.add_argument("--question-tokens", type=int, default=192)
    ap.add_argument("--answer-tokens", type=int, default=8)
    ap.add_argument("--gap-s", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from streamfuse.lm.config import ModelConfig
    from streamfuse.lm.loader import load_model
    from streamfuse.testing.machine import cpu_description

    torch.set_num_threads(args.threads)
    print(f"cpu: {cpu_description()}; torch threads {args.threads}", flush=True)
    model, tok = load_model(ModelConfig(weights="int8", threads=args.threads))
    assert tok is not None
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for r in range(args.rounds):
        for on in (True, False) if r % 2 == 0 else (False, True):
            res = phase(model, tok, args, on, seed=r)
            runs[on].append(res)
            q = percentiles(res["ttft_ms"])
            print(
                f"round {r} reschedule={'on ' if on else 'off'}: TTFT p50 "
                f"{q['p50']:7.1f} ms, p95 {q['p95']:7.1f} ms; background "
                f"{res['background_tok_s']:6.1f} prompt tok/s, {res['documents']} documents; "
                f"rescheduled steps {res['rescheduled_steps']}, hit rate "
                f"{res['hit_rate'] if res['hit_rate'] is None else round(res['hit_rate'], 3)}",
                flush=True,
            )
    summary: dict[str, Any] = {}
    for on, key in ((True, "on"), (False, "off")):
        q = percentiles(t for res in runs[on] for t in res["ttft_ms"])
        summary[f"ttft_p50_ms_{key}"] = round(q["p50"], 1)
        summary[f"ttft_p95_ms_{key}"] = round(q["p95"], 1)
        summary[f"background_tok_s_{key}"] = round(
            statistics.mean(r["background_tok_s"] for r in runs[on]), 1
        )
        summary[f"documents_{key}"] = sum(r["documents"] for r in runs[on])
        summary[f"rescheduled_steps_{key}"] = sum(r["rescheduled_steps"] for r in runs[on])
    summary["ttft_p95_ratio_off_over_on"] = round(
        summary["ttft_p95_ms_off"] / summary["ttft_p95_ms_on"], 2
    )
    rates = [r["hit_rate"] for r in runs[True] if r["hit_rate"] is not None]
    summary["hit_rate_on"] = round(statistics.mean(rates), 3) if rates else None
    summary["cpu"] = cpu_description()
    summary["threads"] = args.threads
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
