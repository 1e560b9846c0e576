"""Prompt-lookup (n-gram) drafting and greedy verification for speculative decoding (F6).

The drafter proposes the tokens that followed the most recent earlier occurrence of the
sequence's last n tokens (n from `max_ngram` down to `min_ngram`): free, and very good when the
output quotes its input (transcripts, slides, code). The engine appends the drafts to the
sequence's next decode row, runs them in the same forward as everything else, and keeps the
longest prefix on which the model's own greedy choice agrees, plus the model's next token, so
the output is exactly what plain greedy decoding would produce.

Drafts that get rejected still cost verification rows, so each drafter adapts how many tokens
it proposes (`allowance` / `observe`): all accepted doubles it (up to `max_draft`), a partial
match sets it just past the accepted run, none accepted halves it, and at zero drafting pauses
for `pause_steps` steps before trying one token again. A quoting answer keeps full drafts; free
text, where n-gram matches are mostly coincidental, falls back to near-plain decoding.
"""

from __future__ import annotations

from collections.abc import Iterable


class NgramDrafter:
    """Incremental n-gram index over a token history, bounded to the last `window` tokens."""

    def __init__(
        self,
        tokens: Iterable[int] = (),
        *,
        max_ngram: int = 3,
        min_ngram: int = 1,
        window: int = 4096,
        max_draft: int = 8,
        pause_steps: int = 8,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        self.max_draft = max_draft
        self.pause_steps = pause_steps
        self.budget = max_draft  # tokens the next draft may have
        self._paused = 0
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.window = max(window, 2 * max_ngram)
        self._hist: list[int] = []
        self._offset = 0  # absolute index of _hist[0]
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> absolute index of its last token
        self.extend(tokens)

    def __len__(self) -> int:
        return self._offset + len(self._hist)

    def extend(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self._append(int(t))

    def _append(self, token: int) -> None:
        # Index the n-grams that end at the previous token, so a lookup of the current suffix
        # finds only earlier occurrences (never itself).
        end = len(self._hist) - 1
        if end >= 0:
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n + 1 < 0:
                    break
                self._last[tuple(self._hist[end - n + 1 : end + 1])] = self._offset + end
        self._hist.append(token)
        if len(self._hist) > 2 * self.window:
            self._rebuild()

    def _rebuild(self) -> None:
        keep = self._hist[-self.window :]
        self._offset += len(self._hist) - len(keep)
        self._hist = []
        self._last = {}
        for t in keep:
            self._append(t)

    def allowance(self) -> int:
        """How many tokens to draft this step (0 while paused); call once per step."""
        if self._paused > 0:
            self._paused -= 1
            return 0
        return self.budget

    def observe(self, proposed: int, accepted: int) -> None:
        """Adapt the draft length to how a verified draft of `proposed` tokens fared."""
        if proposed <= 0:
            return
        if accepted >= proposed:
            self.budget = min(self.max_draft, 2 * self.budget)
        elif accepted > 0:
            self.budget = min(self.max_draft, accepted + 1)
        else:
            self.budget //= 2
            if self.budget == 0:
                self.budget = 1
                self._paused = self.pause_steps

    def draft(self, max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens predicted to follow the current history."""
        if max_tokens <= 0 or not self._hist:
            return []
        hist = self._hist
        for n in range(min(self.max_ngram, len(hist)), self.min_ngram - 1, -1):
            end = self._last.get(tuple(hist[len(hist) - n :]))
            if end is None:
                continue
            start = end - self._offset + 1
            if start < 0:
                continue
            return hist[start : start + max_tokens]
        return []


def accept_greedy(drafts: list[int], predictions: list[int]) -> list[int]:
    """Tokens to emit given drafts d1..dk and the model's greedy picks p0..pk at rows t0,d1..dk.

    p_i is the model's choice after seeing d_i (d_0 being the real last token); draft d_{i+1} is
    accepted while it equals p_i. The result is p_0..p_a where a drafts were accepted: a + 1
    tokens, exactly those greedy decoding would have produced one by one.
    """
    if len(predictions) != len(drafts) + 1:
        raise ValueError(f"{len(predictions)} predictions for {len(drafts)} drafts")
    out: list[int] = []
    for i, p in enumerate(predictions):
        out.append(p)
        if i == len(drafts) or drafts[i] != p:
            break
    return out
