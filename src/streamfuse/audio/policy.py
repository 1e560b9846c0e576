"""The commit policy of streaming ASR: LocalAgreement-2 over successive hypotheses.

The audio buffer is re-transcribed as it grows; each hypothesis is a list of timed `Word`s.
A word is committed once two consecutive hypotheses agree on it (longest common prefix of their
uncommitted parts). The policy never takes a committed word back (the stage's utterance-end
revision is a separate, explicit event); words a new hypothesis repeats from
before the last commit are recognised by their times (and an n-gram check against the committed
tail, for timestamp jitter) and dropped, so trimming the buffer neither duplicates nor loses words.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import takewhile

from streamfuse.events import AsrWord

_PUNCT = re.compile(r"[^\w']+")
_SENTENCE_END = re.compile(r"[.?!][\"')\]]*$")


@dataclass(frozen=True, slots=True)
class Word:
    """One recognised word: text, media-time span in seconds and probability."""

    word: str
    t_start: float
    t_end: float
    p: float = 1.0
    #: A slide term put in place of heard words after the model's own check
    #: (`priming.correct_terms`): its `p` is the term's, read with the slide terms in the prompt.
    checked: bool = False

    @property
    def key(self) -> str:
        """The form words are compared in: lower case, no punctuation."""
        return _PUNCT.sub("", self.word.lower())

    @property
    def ends_sentence(self) -> bool:
        return bool(_SENTENCE_END.search(self.word.strip()))

    def shifted(self, dt: float) -> Word:
        return replace(self, t_start=self.t_start + dt, t_end=self.t_end + dt)

    def to_payload(self) -> AsrWord:
        """The word as it goes into an `asr` event (stripped, times to the millisecond)."""
        return AsrWord(
            word=self.word.strip(),
            t_start=round(self.t_start, 3),
            t_end=round(self.t_end, 3),
            p=round(self.p, 3),
        )


def join_words(words: Iterable[Word]) -> str:
    """Words as text. Whisper marks a word that continues the previous one ("real" "-time",
    "it" "'s") by the missing leading space; those attach without a space."""
    out: list[str] = []
    for w in words:
        text = w.word.strip()
        if not text:
            continue
        attaches = out and not w.word[0].isspace() and not text[0].isalnum()
        if attaches:
            out[-1] += text
        else:
            out.append(text)
    return " ".join(out)


class LocalAgreement:
    """LocalAgreement-2: commit the longest common prefix of the last two hypotheses.

    `time_tolerance_s` is how much earlier than the last committed word's end a new word may
    start and still count as new; `ngram_window_s` bounds how far after that end an n-gram
    repeat of the committed tail is still treated as timestamp jitter (and dropped).
    `carry`: a hypothesis that stops short of the pending words (it heard nothing there: a
    truncated or empty reading, common in noise) keeps them pending after its own words instead
    of forgetting them, so they can still agree with a later one or age (`commit_until`).
    """

    def __init__(
        self,
        *,
        time_tolerance_s: float = 0.1,
        ngram_window_s: float = 0.5,
        max_ngram: int = 5,
        carry: bool = False,
    ) -> None:
        self.time_tolerance_s = time_tolerance_s
        self.carry = carry
        self.ngram_window_s = ngram_window_s
        self.max_ngram = max_ngram
        #: Media time where the last committed word ends (-inf before the first commit).
        self.committed_end = float("-inf")
        self._tail: deque[Word] = deque(maxlen=max_ngram)
        self._prev: list[Word] | None = None

    @property
    def pending(self) -> list[Word]:
        """The uncommitted words of the latest hypothesis (the partial transcript)."""
        return list(self._prev or [])

    def new_words(self, hypothesis: Sequence[Word]) -> list[Word]:
        """The part of `hypothesis` after what is already committed (by time, then n-gram)."""
        words = [w for w in hypothesis if w.t_start > self.committed_end - self.time_tolerance_s]
        if not words or not self._tail:
            return words
        if words[0].t_start > self.committed_end + self.ngram_window_s:
            return words
        tail = [w.key for w in self._tail]
        for n in range(min(len(tail), len(words), self.max_ngram), 0, -1):
            if tail[-n:] == [w.key for w in words[:n]]:
                return words[n:]
        return words

    def insert(
        self, hypothesis: Sequence[Word], *, min_p: float = 0.0, before: float = float("inf")
    ) -> list[Word]:
        """Feed a new hypothesis; return the words it commits (maybe none).

        The agreed prefix stops at the first word the new hypothesis is unsure of (probability
        below `min_p`) or that ends after media time `before`: such words wait for a later,
        better-informed hypothesis (a full-window pass at the next pause) to confirm them.
        """
        new = self.new_words(hypothesis)
        prev = self._prev
        if prev is None:
            self._prev = new
            return []
        n = 0
        while (
            n < len(prev)
            and n < len(new)
            and prev[n].key == new[n].key
            and new[n].p >= min_p
            and new[n].t_end <= before
        ):
            n += 1
        committed = new[:n]
        self._commit(committed)
        self._prev = self._carried(new[n:], prev)
        return committed

    def observe(self, hypothesis: Sequence[Word]) -> None:
        """Take `hypothesis` as the pending (partial) transcript without committing anything:
        for hypotheses too unreliable to commit from, which a later one must confirm."""
        self._prev = self._carried(self.new_words(hypothesis), self._prev)

    def _carried(self, new: list[Word], prev: list[Word] | None) -> list[Word]:
        """`new` pending words, followed (with `carry`) by the `prev` pending words that lie
        after its last word: time the new hypothesis said nothing about."""
        if not self.carry or not prev:
            return new
        last = max(new[-1].t_end if new else float("-inf"), self.committed_end)
        return [*new, *(w for w in prev if (w.t_start + w.t_end) / 2 > last)]

    def commit_all(self, hypothesis: Sequence[Word] | None = None) -> list[Word]:
        """Commit all of `hypothesis` (default: the pending words) that is new; clear pending.

        Used at the end of an utterance (VAD silence), on a forced trim, and at end of stream.
        """
        words = self.pending if hypothesis is None else self.new_words(hypothesis)
        self._prev = None
        self._commit(words)
        return words

    def commit_until(self, t: float, *, min_p: float = 0.0) -> list[Word]:
        """Commit the pending words that end by media time `t` (forced trim of a long buffer,
        or words waiting too long), stopping at the first with a probability below `min_p`."""
        pending = self.pending
        words = list(takewhile(lambda w: w.t_end <= t and w.p >= min_p, pending))
        if words:
            self._prev = pending[len(words) :]
            self._commit(words)
        return words

    def reset_context(self) -> None:
        """Forget the committed tail for n-gram matching (the buffer restarted after silence)."""
        self._tail.clear()
        self._prev = None

    def _commit(self, words: Sequence[Word]) -> None:
        for w in words:
            self._tail.append(w)
            self.committed_end = max(self.committed_end, w.t_end)


__all__ = ["LocalAgreement", "Word", "join_words"]
