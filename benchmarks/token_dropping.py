"""Token dropping and KV eviction (F17/F18) vs full context, side by side in one run.

Context: the committed timeline QA set (assets/eval/lmqa/timeline_qa.json: seven generated
clips, ~1,400 Gemma tokens of SLIDE/SPEECH lines); each question is appended to it. For each
keep ratio x method (full; random, recency window, StreamingLLM sinks, FastV, H2O, MiniLM
similarity only, ours) it measures: prefill time (context + question into an empty slot,
dropping included), decode tokens/s on the kept cache, KV bytes held, QA accuracy (the known
answer in the first line of a greedy answer), and, on every question, greedy agreement and KL
over 64 tokens teacher-forced on the full-context continuation (model-independent fidelity)
plus the same agreement over the answer alone (up to where the LM stage stops it: the first
line break after text, or an end-of-turn id) and where the first difference falls. It also
probes how well each importance signal finds the answer's line (AUC), and scores semantic
windows' boundary F1 on the demo clip and the speech-set clips (other voices), on words timed
from the truth and (`--asr-windows`) on the words tiny.en writes for the real audio.
A control row, `full_chunked`, feeds the whole context line by line (as the live stage feeds
it) and drops nothing; scored like the methods against the batched full-context reference, its
agreement (`agreement_full_self`) is the benchmark's own floor: with int8 activations a change
of float rounding anywhere (here only chunked vs batched attention) resamples the quantization
noise (docs/token-dropping.md), so no method can be expected to agree better than it.
Every timing is on a shared machine: ratios of interleaved runs, noisy. The last line is one
JSON object (prefill_speedup_25, kv_ratio_25, qa_retained_25, agreement_25, ...).

    python benchmarks/token_dropping.py [--quick] [--questions N] [--threads 2] [--set QA.json]
        [--weights int8|fp32] [--smooth-alpha A] [--out results.json] [--asr-windows]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.token_dropping")
#: The control row: the full context fed line by line, nothing dropped.
CONTROL = ("full_chunked", 1.0)

SPEECH_CLIPS = [
    "bayes-nyc-brown5",
    "chem-lanc-white12-offslide",
    "eigen-carib-babble15",
    "glaciers-wmids-brown10",
    "kubernetes-us-white20",
    "mito-scot-pink18",
    "paths-rp-music",
    "transport-f-babble15-offslide",
    "human-dickens",
    "human-beckett",
]


def auc(scores: list[float], positive: list[bool]) -> float:
    """Probability that a random positive outranks a random negative (ties count half)."""
    pos = [s for s, p in zip(scores, positive, strict=True) if p]
    neg = [s for s, p in zip(scores, positive, strict=True) if not p]
    if not pos or not neg:
        return float("nan")
    import torch

    n = torch.tensor(neg)
    wins = sum(float((n < s).sum()) + 0.5 * float((n == s).sum()) for s in pos)
    return wins / (len(pos) * len(neg))


def probe_signals(model: Any, ids: list[int], query_rows: int, context: int) -> dict[str, Any]:
    """Importance signals after layer 2 of a forward that drops nothing (F17 probe)."""
    import torch

    from streamfuse.lm.dropping import (
        attention_entropy,
        key_norms,
        method_plan,
        query_attention,
    )
    from streamfuse.lm.gemma import Segment

    probe: dict[str, Any] = {}

    def scorer(view: Any) -> Any:
        probe["fastv_attention"] = query_attention(view, rows=1)[:context]
        probe["attention_entropy"] = -attention_entropy(view)[:context]  # low entropy: specific
        probe["key_norm"] = key_norms(view)[:context]
        return torch.zeros(view.layout.numel())

    n = len(ids)
    plan = method_plan("fastv", n, 1.0, query_rows=query_rows)
    plan.scorer, plan.probe = scorer, True
    pool = model.kv_pool(num_slots=1, max_tokens=n)
    model.forward(torch.tensor(ids), [Segment(0, 0, n)], pool, drop=plan)
    return probe


def _clip_paths() -> list[tuple[str, Path, Path]]:
    """(name, truth, audio) of the demo clip and the speech-set clips (other voices)."""
    demo = ROOT / "src/streamfuse/assets/demo"
    speech = ROOT / "assets/eval/speech"
    return [("lecture", demo / "lecture.truth.json", demo / "lecture.mp4")] + [
        (c, speech / f"{c}.truth.json", speech / f"{c}.ogg") for c in SPEECH_CLIPS
    ]


def window_f1(asr: bool = False) -> dict[str, Any]:
    """Sentence-boundary F1 of semantic windows per clip. `punctuated` / `unpunctuated`: words
    timed from the truth sentences (no pause inside a sentence); `asr`: the words, punctuation
    and word times tiny.en writes for the clip's real audio (offline, one full pass), scored
    against the truth's sentence ends carried over to those words by alignment."""
    from streamfuse.text.windows import (
        SemanticWindower,
        WindowConfig,
        Word,
        boundary_f1,
        map_boundaries,
        sentence_boundaries,
        words_from_sentences,
    )

    windower = SemanticWindower(WindowConfig(use_topics=False))
    modes = ["punctuated", "unpunctuated"] + (["asr"] if asr else [])
    out: dict[str, Any] = {}
    transcriber: Any = None
    for mode in modes:
        f1s: dict[str, float] = {}
        detail: dict[str, Any] = {}
        for name, truth_path, audio_path in _clip_paths():
            truth = json.loads(truth_path.read_text())
            sents = [(a["t_start"], a["t_end"], a["text"]) for a in truth["asr"]]
            bounds = sentence_boundaries(sents)
            if mode == "asr":
                from faster_whisper import decode_audio

                from streamfuse.audio import AsrConfig, WhisperTranscriber

                if transcriber is None:
                    transcriber = WhisperTranscriber(AsrConfig(model="tiny.en"))
                heard = transcriber.transcribe(decode_audio(str(audio_path), sampling_rate=16000))
                words = [Word(w.word.strip(), w.t_start, w.t_end) for w in heard]
                truth_words = [t for _, _, text in sents for t in text.split()]
                bounds = map_boundaries(truth_words, bounds, [w.text for w in words])
            else:
                words = words_from_sentences(sents, punctuated=mode == "punctuated")
            wins = windower.cut(words)
            cuts = {w.last for w in wins}
            f1s[name] = boundary_f1(cuts, bounds)
            detail[name] = {
                "missed": [" ".join(w.text for w in words[max(0, i - 2) : i + 1])
                           for i in sorted(bounds - cuts)],
                "extra": [f"{' '.join(w.text for w in win.words[-3:])} ({win.reason})"
                          for win in wins if win.last in cuts - bounds],
            }  # fmt: skip
        others = [v for k, v in f1s.items() if k != "lecture"]
        out[mode] = {
            "mean": statistics.mean(f1s.values()),
            "demo": f1s["lecture"],
            "other_voices_mean": statistics.mean(others),
            "other_voices_min": min(others),
            "per_clip": f1s,
            "errors": {k: v for k, v in detail.items() if v["missed"] or v["extra"]},
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="25%% only, 4 questions: a few minutes")
    ap.add_argument(
        "--questions",
        type=int,
        default=None,
        help="questions to run (default: 4 with --quick, else all; set A has 20, set B 11)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--weights",
        choices=("int8", "fp32"),
        default="int8",
        help="int8 (the engine's default) or fp32 (no activation rounding: agreement then "
        "measures dropping alone, without int8 noise)",
    )
    ap.add_argument(
        "--smooth-alpha",
        type=float,
        default=None,
        help="int8 activation-outlier smoothing strength (ModelConfig.smooth_alpha; default "
        "the engine's; 0: plain per-row int8, as before smoothing)",
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--set",
        type=Path,
        default=None,
        help="QA set (default: assets/eval/lmqa/timeline_qa.json; a second split, other clips: "
        "assets/eval/lmqa/timeline_qa_b.json)",
    )
    ap.add_argument(
        "--asr-windows",
        action="store_true",
        help="also score semantic windows on tiny.en's words for each clip's real audio",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    import torch
    import torch.nn.functional as F

    from streamfuse.lm.config import ModelConfig
    from streamfuse.lm.dropping import METHODS, Compressed, ContextInfo, compress_prefill
    from streamfuse.lm.evalset import DEFAULT_SET, answer_correct, load_set
    from streamfuse.lm.gemma import Segment
    from streamfuse.lm.loader import load_model
    from streamfuse.testing.machine import cpu_description
    from streamfuse.text.windows import minilm

    t_start = time.perf_counter()
    log.info("CPU: %s; torch %s, %d threads", cpu_description(), torch.__version__, args.threads)
    torch.set_num_threads(args.threads)
    mcfg = ModelConfig(weights=args.weights, threads=args.threads)
    if args.smooth_alpha is not None:
        mcfg = mcfg.model_copy(update={"smooth_alpha": args.smooth_alpha})
    model, tok = load_model(mcfg)
    assert tok is not None
    log.info("kernel path: %s", "fused C++ int8 kernels" if model.fused else "eager torch ops")
    emb = minilm()
    c = model.config
    kv_bytes_per_token = c.num_layers * 2 * c.num_kv_heads * c.head_dim * 4

    qa_set = args.set or DEFAULT_SET
    lines, pairs = load_set(qa_set)
    ratios = [0.25] if args.quick else [0.5, 0.25, 0.1]
    n_pairs = min(len(pairs), args.questions or (4 if args.quick else len(pairs)))
    # Agreement on every question asked (it was the first 2 in --quick, 5 in a full run: 128
    # tokens made the figure hinge on one question's free continuation); ~1 s per question.
    n_agree = n_pairs
    n_probe = 2 if args.quick else len(pairs)
    # Spread the quick subset over clips and kinds.
    order = pairs[::2] + pairs[1::2]
    pairs = order[:n_pairs]

    # Context: line by line (as the timeline stage feeds it), each token tagged with its line.
    ctx: list[int] = [tok.bos_id] if tok.bos_id is not None else []
    groups: list[int] = [0] * len(ctx)
    modality: list[int] = [-1] * len(ctx)
    line_ends: list[int] = []  # where each line's chunk ends (the first carries the BOS)
    for gi, line in enumerate(lines):
        ids = tok.encode(line)
        ctx += ids
        line_ends.append(len(ctx))
        groups += [gi] * len(ids)
        kind = 0 if "] SLIDE:" in line else 1 if "] SPEECH:" in line else -1
        modality += [kind] * len(ids)
    line_emb = emb.embed([ln.split(": ", 1)[-1] for ln in lines])
    nl = tok.encode("\n")[-1]
    log.info("context: %d lines, %d tokens; %d questions", len(lines), len(ctx), len(pairs))

    rows: dict[tuple[str, float], dict[str, list[float]]] = {}
    signal_auc: dict[str, list[float]] = {"fastv_attention": [], "attention_entropy": [],
                                          "key_norm": [], "minilm_similarity": []}  # fmt: skip
    gaps: list[float] = []

    def record(key: tuple[str, float], **vals: float) -> None:
        d = rows.setdefault(key, {})
        for k, v in vals.items():
            d.setdefault(k, []).append(v)

    def generate(pool: Any, first: int, length: int, n: int, stop: bool) -> tuple[list[int], float]:
        out = [first]
        t0 = time.perf_counter()
        while len(out) < n and not (stop and out[-1] == nl and len(out) > 1):
            nxt = model.forward(
                torch.tensor([out[-1]]), [Segment(0, length + len(out) - 1, 1)], pool, greedy=True
            )
            out.append(int(nxt[0]))
        steps = max(1, len(out) - 1)
        return out, steps / max(1e-9, time.perf_counter() - t0)

    stops = {*tok.stop_ids}

    def answer_end(cont: list[int]) -> int:
        """Index of the token the LM stage would stop the answer at (stop_at_newline: the first
        line break after some text, or an end-of-turn / end-of-sequence id; at most 64)."""
        for i, t in enumerate(cont):
            if t in stops or (t == nl and any(u != nl for u in cont[:i])):
                return i
        return len(cont) - 1

    def forced_logits(pool: Any, length: int, cont: list[int]) -> Any:
        return model.forward(torch.tensor(cont[:-1]), [Segment(0, length, len(cont) - 1)], pool)

    def chunked_prefill(pool: Any, ids: list[int]) -> Any:
        """The whole context a line per forward, then the question: as the live stage feeds
        the timeline (nothing dropped); returns the last row's logits."""
        start = 0
        for end in [*line_ends, len(ids)]:
            logits = model.forward(torch.tensor(ids[start:end]), [Segment(0, start, end - start)],
                                   pool, out_rows=torch.tensor([end - start - 1]))  # fmt: skip
            start = end
        return logits[0]

    for pi, pair in enumerate(pairs):
        q_ids = tok.encode("\n" + pair.prompt)
        ids = ctx + q_ids
        n = len(ids)
        # The question's embedding is work done at ask time: it counts in the prefill of the
        # methods that use it (minilm, ours). The lines' embeddings are made as lines arrive.
        t0 = time.perf_counter()
        qv = emb.embed([pair.question])[0]
        t_embed_q = time.perf_counter() - t0
        line_sim = (line_emb @ qv).tolist()
        sim = torch.tensor([line_sim[g] for g in groups] + [1.0] * len(q_ids))
        info = ContextInfo(
            torch.tensor(groups + [len(lines)] * len(q_ids)),
            torch.tensor(modality + [-1] * len(q_ids)),
            sim,
        )
        pool = model.kv_pool(num_slots=1, max_tokens=n + 80)
        source_line = next(i for i, ln in enumerate(lines) if pair.source in ln)
        positive = [g == source_line for g in groups]

        if pi < n_probe:
            probe = probe_signals(model, ids, len(q_ids), len(ctx))
            probe["minilm_similarity"] = sim[: len(ctx)]
            for k, v in probe.items():
                signal_auc[k].append(auc(v.tolist(), positive))

        # Full context: reference answer, timing, and the continuation agreement is measured on.
        t0 = time.perf_counter()
        full = compress_prefill(model, ids, pool, 0, "full", 1.0, query_rows=len(q_ids))
        t_full = time.perf_counter() - t0
        ans, tok_s = generate(pool, int(full.logits.argmax()), n, 12, True)
        ok_full = answer_correct(tok.decode(ans), pair.answer)
        record(("full", 1.0), prefill_s=t_full, tok_s=tok_s, kv_bytes=n * kv_bytes_per_token,
               qa=float(ok_full))  # fmt: skip
        cont: list[int] = []
        full_lp: Any = None
        ans_end = 0
        if pi < n_agree:
            cont, _ = generate(pool, int(full.logits.argmax()), n, 64, False)
            ans_end = answer_end(cont)
            lg = forced_logits(pool, n, cont)
            full_lp = F.log_softmax(torch.cat([full.logits[None], lg]).float(), dim=-1)
        log.info("[%6.1f s] full context done", time.perf_counter() - t_start)
        log.info("Q%d %s -> %r (want %r) full=%s", pi, pair.question, tok.decode(ans).strip(),
                 pair.answer, ok_full)  # fmt: skip

        runs: list[tuple[str, float]] = [CONTROL] + [(m, r) for r in ratios for m in METHODS]
        for method, ratio in runs:
            pool = model.kv_pool(num_slots=1, max_tokens=n + 80)
            t0 = time.perf_counter()
            if (method, ratio) == CONTROL:
                r = Compressed(chunked_prefill(pool, ids), list(range(n)))
            else:
                r = compress_prefill(
                    model, ids, pool, 0, method, ratio, query_rows=len(q_ids), info=info, seed=pi
                )
            dt = time.perf_counter() - t0
            if method in ("minilm", "ours"):
                dt += t_embed_q
            m = len(r.kept)
            if "modal_entropy_gap" in r.signals and ratio == ratios[0]:
                gaps.append(r.signals["modal_entropy_gap"])
            ans, tok_s = generate(pool, int(r.logits.argmax()), m, 12, True)
            ok = answer_correct(tok.decode(ans), pair.answer)
            vals: dict[str, float] = {
                "prefill_s": dt,
                "tok_s": tok_s,
                "kv_bytes": m * kv_bytes_per_token,
                "qa": float(ok),
                "speedup": t_full / dt,
                "kept_answer_line": float(any(positive[i] for i in r.kept if i < len(positive))),
            }
            if cont:
                lg = forced_logits(pool, m, cont)
                lp = F.log_softmax(torch.cat([r.logits[None], lg]).float(), dim=-1)
                match = lp.argmax(-1) == torch.tensor(cont)
                vals["agreement"] = float(match.float().mean())
                vals["answer_agreement"] = float(match[: ans_end + 1].float().mean())
                miss = (~match).nonzero()
                vals["first_divergence"] = float(miss[0, 0]) if miss.numel() else 64.0
                vals["kl"] = float(
                    F.kl_div(lp, full_lp, log_target=True, reduction="none").sum(-1).mean()
                )
            record((method, ratio), **vals)
        log.info("[%6.1f s] question %d/%d done", time.perf_counter() - t_start, pi + 1, len(pairs))

    def mean(key: tuple[str, float], k: str) -> float:
        v = rows.get(key, {}).get(k, [])
        return statistics.mean(v) if v else float("nan")

    full_key = ("full", 1.0)
    qa_full = mean(full_key, "qa")
    table: list[dict[str, Any]] = []
    log.info(
        "\n%-12s %5s %9s %8s %7s %9s %6s %6s %6s %6s %6s %7s",
        "method", "keep", "prefill_s", "speedup", "tok_s", "KV_MB", "QA", "agree", "ans_ag",
        "1st_dv", "KL", "ansline",
    )  # fmt: skip
    for key in [full_key, CONTROL] + [(m, r) for r in ratios for m in METHODS]:
        t_sum = sum(rows[key]["prefill_s"])
        row = {
            "method": key[0],
            "keep": key[1],
            "prefill_s": t_sum / len(rows[key]["prefill_s"]),
            "speedup": sum(rows[full_key]["prefill_s"]) / t_sum,
            "tok_s": mean(key, "tok_s"),
            "kv_mb": mean(key, "kv_bytes") / 2**20,
            "qa": mean(key, "qa"),
            "agreement": mean(key, "agreement") if key != full_key else 1.0,
            "answer_agreement": mean(key, "answer_agreement") if key != full_key else 1.0,
            "first_divergence": (
                statistics.median(rows[key]["first_divergence"])
                if key != full_key and rows[key].get("first_divergence")
                else 64.0
            ),
            "kl": mean(key, "kl") if key != full_key else 0.0,
            "answer_line_kept": mean(key, "kept_answer_line") if key != full_key else 1.0,
        }
        table.append(row)
        log.info(
            "%-12s %4.0f%% %9.3f %7.2fx %7.1f %9.2f %6.2f %6.3f %6.3f %6.1f %6.3f %7.2f",
            row["method"], 100 * row["keep"], row["prefill_s"], row["speedup"], row["tok_s"],
            row["kv_mb"], row["qa"], row["agreement"], row["answer_agreement"],
            row["first_divergence"], row["kl"], row["answer_line_kept"],
        )  # fmt: skip
    aucs = {k: statistics.mean(v) for k, v in signal_auc.items()}
    log.info("answer-line AUC of importance signals at layer 2: %s", aucs)
    windows = window_f1(asr=args.asr_windows)
    log.info("semantic windows boundary F1: %s", json.dumps(windows))

    def at(method: str, k: str) -> float:
        return next(r[k] for r in table if r["method"] == method and r["keep"] == 0.25)

    control = next(r for r in table if (r["method"], r["keep"]) == CONTROL)

    def retained(method: str) -> float | None:
        # None (JSON null, not NaN) when the full context answers nothing: undefined.
        return round(at(method, "qa") / qa_full, 3) if qa_full > 0 else None

    summary = {
        "prefill_speedup_25": round(at("ours", "speedup"), 2),
        "kv_ratio_25": round(mean(full_key, "kv_bytes") / mean(("ours", 0.25), "kv_bytes"), 2),
        "qa_retained_25": retained("ours"),
        "agreement_25": round(at("ours", "agreement"), 3),
        "qa_retained_25_fastv": retained("fastv"),
        "qa_retained_25_h2o": retained("h2o"),
        "qa_retained_25_random": retained("random"),
        "window_boundary_f1": round(windows["punctuated"]["mean"], 3),
        "window_boundary_f1_demo": round(windows["punctuated"]["demo"], 3),
        "window_boundary_f1_other_voices_min": round(windows["punctuated"]["other_voices_min"], 3),
        "window_boundary_f1_asr": round(windows["asr"]["mean"], 3) if "asr" in windows else None,
        "window_boundary_f1_asr_demo": (
            round(windows["asr"]["demo"], 3) if "asr" in windows else None
        ),
        "window_boundary_f1_asr_other_voices_min": (
            round(windows["asr"]["other_voices_min"], 3) if "asr" in windows else None
        ),
        "qa_full": round(qa_full, 3),
        "qa_retained_25_minilm": retained("minilm"),
        "qa_retained_25_sinks": retained("sinks"),
        "agreement_25_fastv": round(at("fastv", "agreement"), 3),
        "agreement_25_h2o": round(at("h2o", "agreement"), 3),
        "agreement_25_minilm": round(at("minilm", "agreement"), 3),
        "agreement_25_random": round(at("random", "agreement"), 3),
        "answer_agreement_25": round(at("ours", "answer_agreement"), 3),
        "answer_agreement_25_fastv": round(at("fastv", "answer_agreement"), 3),
        "answer_agreement_25_h2o": round(at("h2o", "answer_agreement"), 3),
        "first_divergence_25": at("ours", "first_divergence"),
        "first_divergence_25_h2o": at("h2o", "first_divergence"),
        "agreement_questions": min(n_agree, len(pairs)),
        # The floor: nothing dropped, only fed as the live stage feeds it (line by line).
        "agreement_full_self": round(control["agreement"], 3),
        "answer_agreement_full_self": round(control["answer_agreement"], 3),
        "kl_full_self": round(control["kl"], 4),
        "qa_retained_full_self": round(control["qa"] / qa_full, 3) if qa_full > 0 else None,
        "kl_25": round(at("ours", "kl"), 3),
        "signal_auc": {k: round(v, 3) for k, v in aucs.items()},
        "modal_entropy_gap": round(statistics.mean(gaps), 3) if gaps else None,
        "questions": len(pairs),
        "qa_set": qa_set.name,
        "context_tokens": len(ctx),
        "kernel_path": "fused" if model.fused else "eager",
        "weights": args.weights,
        "smooth_alpha": mcfg.smooth_alpha if args.weights == "int8" else None,
        "cpu": cpu_description(),
        "threads": args.threads,
        "quick": args.quick,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "table": table, "windows": windows}))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
