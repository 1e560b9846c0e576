"""Timeline question-answer pairs with known answers, generated from generated clips' truth.

`timeline_text(truths)` renders clips' truth (slides and speech, `scripts/make_demo_clip.py`
format) the way `fusion/timeline.py` feeds the LM (`[12.0s] SLIDE: ...` lines after the
header), clip after clip on one clock. `qa_pairs(truth)` derives extraction questions a 270M
base model can answer ("Q: What is the mean delay?\nA:" -> "180 ms") by fixed rules from slide
lines and spoken sentences. `answer_correct` scores a generated answer against the known one.
Run as a module to regenerate the committed sets: the default split (assets/eval/lmqa/
timeline_qa.json) and, with `--split b`, a second split from other clips (timeline_qa_b.json:
the speech-set clips the first does not use, interleaved with the OCR evaluation slides), so
that a change to token dropping tuned on one can be checked on the other.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from streamfuse.text import collapse_whitespace

HEADER = "Live notes. Timeline of slide text (SLIDE) and speech (SPEECH):\n"
QUESTION_TEMPLATE = "Q: {question}\nA:"

# A slide line "<key words> <number>[ unit]": "mean delay 180 ms", "frames in 1800".
_KEY_NUMBER = re.compile(
    r"^(?P<key>[A-Za-z][A-Za-z ]*?) (?P<val>\d[\d.,]*(?: ?(?:ms|MB|GB|s|%))?)$"
)
# "<Label N>: <text>": "Lecture 3: Streaming inference", "Figure 1: Latency per stage ...".
_LABELLED = re.compile(r"^(?P<label>[A-Z][a-z]+ \d+): (?P<text>.+)$")
# Sentence openers that are not a subject ("When the system is busy, ...").
_NOT_SUBJECT = {
    "a", "and", "but", "each", "for", "here", "if", "in", "it", "now", "on", "otherwise",
    "so", "that", "this", "thank", "to", "today", "we", "when", "with", "welcome", "you",
}  # fmt: skip
_BAD_VERBS = {"is", "was", "has", "does", "this", "its", "as", "us", "always", "less"}


@dataclass(frozen=True, slots=True)
class QAPair:
    """One question with its known answer; `source` is the truth line it was made from."""

    clip: str
    question: str
    answer: str
    kind: str  # "slide_value" | "slide_label" | "speech_subject"
    source: str
    t_s: float

    @property
    def prompt(self) -> str:
        return QUESTION_TEMPLATE.format(question=self.question)


def timeline_lines(truth: dict[str, Any], offset_s: float = 0.0) -> list[tuple[float, str, str]]:
    """(time, label, text) of every slide and sentence of one clip, in media order."""
    items: list[tuple[float, str, str]] = []
    for s in truth["ocr"]:
        items.append((offset_s + s["t_start"], "SLIDE", collapse_whitespace(" ".join(s["lines"]))))
    for a in truth["asr"]:
        items.append((offset_s + a["t_start"], "SPEECH", collapse_whitespace(a["text"])))
    items.sort(key=lambda it: (it[0], it[1] != "SLIDE"))
    return items


def timeline_text(truths: Sequence[dict[str, Any]], *, gap_s: float = 2.0) -> list[str]:
    """Context lines (first one led by the header) for clips played one after another."""
    lines: list[str] = []
    offset = 0.0
    for truth in truths:
        for t, label, text in timeline_lines(truth, offset):
            lines.append(f"[{t:.1f}s] {label}: {text}\n")
        offset += float(truth["duration_s"]) + gap_s
    if lines:
        lines[0] = HEADER + lines[0]
    return lines


def _speech_subject(sentence: str) -> tuple[str, str] | None:
    """("What <verb> <rest>?", subject) for a sentence "<Subject> <verb>s <rest>."."""
    words = sentence.rstrip(".!?").split()
    if len(words) < 4 or words[0].lower() in _NOT_SUBJECT or "," in " ".join(words[:4]):
        return None
    for i in range(1, min(5, len(words) - 1)):
        w = words[i]
        if w[0].islower() and w.endswith("s") and w not in _BAD_VERBS and len(w) > 3:
            subject = " ".join(words[:i])
            if {w.lower() for w in words[:i]} & {"and", "are", "is", "was", "were"}:
                return None
            rest = " ".join(words[i:]).split(",")[0]
            return f"What {rest}?", subject
    return None


def qa_pairs(truth: dict[str, Any], clip: str, offset_s: float = 0.0) -> list[QAPair]:
    """Questions with known answers from one clip's slide lines and spoken sentences."""
    out: list[QAPair] = []
    for s in truth["ocr"]:
        t = offset_s + s["t_start"]
        for line in s["lines"]:
            m = _KEY_NUMBER.match(line)
            if m:
                q = f"What is the {m['key'].lower()}?"
                out.append(QAPair(clip, q, m["val"], "slide_value", line, t))
                continue
            m = _LABELLED.match(line)
            if m:
                q = f"What is {m['label']} about?"
                out.append(QAPair(clip, q, m["text"], "slide_label", line, t))
    for a in truth["asr"]:
        qa = _speech_subject(a["text"])
        if qa is not None:
            q, subject = qa
            out.append(
                QAPair(clip, q, subject, "speech_subject", a["text"], offset_s + a["t_start"])
            )
    return out


def normalize_answer(text: str) -> str:
    """Lower case, punctuation and leading articles dropped, whitespace collapsed."""
    text = re.sub(r"[^\w\s]", " ", text.lower())
    words = [w for w in text.split() if w not in {"the", "a", "an"}]
    return " ".join(words)


def answer_correct(generated: str, answer: str) -> bool:
    """The known answer appears in the first line of the generated text (normalized)."""
    first = generated.strip().split("\n")[0]
    return f" {normalize_answer(answer)} " in f" {normalize_answer(first)} "


def build_set(clips: Sequence[tuple[str, Path]], *, gap_s: float = 2.0) -> dict[str, Any]:
    """The evaluation document: context lines of all clips in order, and the QA pairs."""
    truths = [json.loads(p.read_text()) for _, p in clips]
    pairs: list[QAPair] = []
    offset = 0.0
    for (name, _), truth in zip(clips, truths, strict=True):
        pairs.extend(qa_pairs(truth, name, offset))
        offset += float(truth["duration_s"]) + gap_s
    return {
        "clips": [name for name, _ in clips],
        "question_template": QUESTION_TEMPLATE,
        "context_lines": timeline_text(truths, gap_s=gap_s),
        "pairs": [asdict(p) for p in pairs],
    }


def load_set(path: Path) -> tuple[list[str], list[QAPair]]:
    """Context lines and QA pairs of a committed set."""
    doc = json.loads(path.read_text())
    return list(doc["context_lines"]), [QAPair(**p) for p in doc["pairs"]]


DEFAULT_SET = Path(__file__).resolve().parents[3] / "assets" / "eval" / "lmqa" / "timeline_qa.json"
SECOND_SET = DEFAULT_SET.with_name("timeline_qa_b.json")

DEFAULT_CLIPS = (
    "src/streamfuse/assets/demo/lecture.truth.json",
    "assets/eval/speech/bayes-nyc-brown5.truth.json",
    "assets/eval/speech/kubernetes-us-white20.truth.json",
    "assets/eval/speech/mito-scot-pink18.truth.json",
    "assets/eval/speech/glaciers-wmids-brown10.truth.json",
    "assets/eval/speech/paths-rp-music.truth.json",
    "assets/test/short.truth.json",
)
SECOND_CLIPS = (
    "assets/eval/ocr/heldout/heldout_01.truth.json",
    "assets/eval/speech/chem-lanc-white12-offslide.truth.json",
    "assets/eval/speech/eigen-carib-babble15.truth.json",
    "assets/eval/ocr/fresh/fresh_01.truth.json",
    "assets/eval/speech/transport-f-babble15-offslide.truth.json",
    "assets/eval/ocr/heldout/heldout_02.truth.json",
    "assets/eval/speech/human-dickens.truth.json",
    "assets/eval/ocr/fresh/fresh_02.truth.json",
    "assets/eval/speech/human-beckett.truth.json",
    "assets/eval/ocr/heldout/heldout_03.truth.json",
)


def main(argv: Sequence[str] | None = None) -> None:
    root = Path(__file__).resolve().parents[3]
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--split", choices=("a", "b"), default="a", help="default or second")
    parser.add_argument("--out", type=Path, help="default: the split's committed file")
    parser.add_argument("--clips", nargs="*", help="truth files (default: the split's clips)")
    args = parser.parse_args(argv)
    second = args.split == "b"
    paths = args.clips or (SECOND_CLIPS if second else DEFAULT_CLIPS)
    out = args.out or (SECOND_SET if second else DEFAULT_SET)
    clips = [(Path(c).name.removesuffix(".truth.json"), root / c) for c in paths]
    doc = build_set(clips)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
