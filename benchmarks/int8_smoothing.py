"""How far int8 is from fp32, with and without activation-outlier smoothing (lm/smoothing.py).

For each QA set's context (every context line plus its first question, one batched forward),
it runs the bundled model in fp32 and in int8 at each smoothing strength, and reports per set
the KL(fp32 || int8) of the next-token distributions averaged over every position, its max,
how often the greedy token is the same, and the mean NLL (nats) of the context's own next
tokens in fp32 and int8. Deterministic (no timing); the last line is JSON.

    python benchmarks/int8_smoothing.py [--alphas 0,0.7] [--threads 1]
        [--set assets/eval/lmqa/timeline_qa.json --set assets/eval/lmqa/timeline_qa_b.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.int8_smoothing")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--alphas", default="0,0.7", help="comma-separated smooth_alpha values")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", type=Path, action="append", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    import torch
    import torch.nn.functional as F

    from streamfuse.lm.config import ModelConfig
    from streamfuse.lm.evalset import load_set
    from streamfuse.lm.gemma import GemmaModel, Segment
    from streamfuse.lm.loader import load_model
    from streamfuse.testing.machine import cpu_description

    torch.set_num_threads(args.threads)
    sets = args.set or [
        ROOT / "assets/eval/lmqa/timeline_qa.json",
        ROOT / "assets/eval/lmqa/timeline_qa_b.json",
    ]
    ref_model, tok = load_model(ModelConfig(weights="fp32", threads=args.threads))
    assert tok is not None
    inputs: dict[str, list[int]] = {}
    for path in sets:
        lines, pairs = load_set(path)
        ids = [tok.bos_id] if tok.bos_id is not None else []
        for line in lines:
            ids += tok.encode(line)
        inputs[path.name] = ids + tok.encode("\n" + pairs[0].prompt)

    def hidden(model: GemmaModel, ids: list[int]) -> Any:
        pool = model.kv_pool(num_slots=1, max_tokens=len(ids))
        return model.forward(torch.tensor(ids), [Segment(0, 0, len(ids))], pool, return_hidden=True)

    ref_hidden = {name: hidden(ref_model, ids) for name, ids in inputs.items()}
    results: dict[str, dict[str, dict[str, float]]] = {}
    for alpha in [float(a) for a in args.alphas.split(",")]:
        model, _ = load_model(ModelConfig(weights="int8", threads=args.threads, smooth_alpha=alpha))
        key = f"alpha_{alpha:g}"
        results[key] = {}
        for name, ids in inputs.items():
            h = hidden(model, ids)
            kls: list[Any] = []
            same = 0
            nll_ref = nll = 0.0
            target = torch.tensor(ids[1:])
            for r in range(0, len(ids), 128):  # logits of 128 rows at a time (262k vocabulary)
                lr = F.log_softmax(ref_model.weights.output(ref_hidden[name][r : r + 128]), -1)
                lq = F.log_softmax(model.weights.output(h[r : r + 128]), -1)
                kls.append(F.kl_div(lq, lr, log_target=True, reduction="none").sum(-1))
                same += int((lq.argmax(-1) == lr.argmax(-1)).sum())
                t = target[r : r + 128]
                nll_ref -= float(lr[: t.numel()].gather(1, t[:, None]).sum())
                nll -= float(lq[: t.numel()].gather(1, t[:, None]).sum())
            kl = torch.cat(kls)
            results[key][name] = {
                "kl_mean": round(float(kl.mean()), 4),
                "kl_max": round(float(kl.max()), 3),
                "argmax_same": round(same / len(ids), 3),
                "nll_fp32": round(nll_ref / target.numel(), 4),
                "nll_int8": round(nll / target.numel(), 4),
                "positions": len(ids),
            }
            log.info("smooth_alpha %g, %s: %s", alpha, name, results[key][name])
        del model
    print(json.dumps({"kl_int8_vs_fp32": results, "cpu": cpu_description(),
                      "threads": args.threads}))  # fmt: skip


if __name__ == "__main__":
    main()
