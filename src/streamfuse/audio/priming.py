"""Slide-aware speech recognition: terms read on screen prime the speech model.

`ScreenTerms` keeps the text lines read on screen with their media times; as a pipeline
`Observer` it collects them from one stream's `ocr` events (so the audio path never imports the
vision path). `ScreenTerms.terms(t)` gives the distinct rare words shown in the last `window_s`
before media time `t`, newest first, at most `limit`: the ASR stage passes them to Whisper as
hotwords. Bounds against slide text leaking into the transcript: only rare words (those the
model's tokenizer splits into several pieces: a common word needs no priming), never whole lines,
a small cap, priming only once the speech heard shares words with the screen (`relevant`: a
slide about something else is not primed from), `drop_unspoken_terms` removes a primed term
placed where the VAD heard no speech and `drop_recited` a run of primed terms in a row (Whisper
echoing its prompt into a pause).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Sequence

from streamfuse.audio.policy import Word
from streamfuse.events import OcrPayload
from streamfuse.frames import EventFrame
from streamfuse.pipeline import FrameEmitted, Observer

_WORD = re.compile(r"[A-Za-z][A-Za-z'\-]*[A-Za-z]|[A-Za-z]")

#: How a rare word is told from a common one: the number of tokens it encodes to.
TokenCount = Callable[[str], int]


def _key(word: str) -> str:
    return Word(word, 0.0, 0.0).key


class ScreenTerms(Observer):
    """Recent on-screen text of one stream, for priming its speech recognizer.

    `min_conf`: OCR lines read with less confidence are ignored (a misread term would prime the
    recognizer towards a non-word). `min_chars`: shorter words are never terms.
    """

    def __init__(
        self,
        stream_id: str | None = None,
        *,
        window_s: float = 60.0,
        min_chars: int = 4,
        min_conf: float = 0.5,
    ) -> None:
        self.stream_id = stream_id
        self.window_s = window_s
        self.min_chars = min_chars
        self.min_conf = min_conf
        self._times: list[float] = []
        self._lines: list[list[str]] = []

    def on_frame(self, event: FrameEmitted) -> None:
        frame = event.frame
        if not isinstance(frame, EventFrame) or not isinstance(frame.payload, OcrPayload):
            return
        if self.stream_id is not None and frame.stream_id != self.stream_id:
            return
        # `min_conf` was chosen on the recognizer's own score, not on the calibrated `conf`.
        lines = [
            ln.text
            for ln in frame.payload.lines
            if (ln.conf if ln.conf_raw is None else ln.conf_raw) >= self.min_conf
        ]
        self.add(lines, frame.t_media)

    def add(self, lines: Iterable[str], t_media: float) -> None:
        """Text shown from media time `t_media` on (kept in time order)."""
        i = bisect.bisect_right(self._times, t_media)
        self._times.insert(i, t_media)
        self._lines.insert(i, list(lines))
        # Older than any window can reach: forget (the newest reading stays however old).
        while len(self._times) > 1 and self._times[1] < self._times[-1] - 2 * self.window_s:
            del self._times[0], self._lines[0]

    def lines(self, t_media: float) -> list[str]:
        """Lines on screen at some time in (t_media - window_s, t_media], newest first."""
        hi = bisect.bisect_right(self._times, t_media)
        out: list[str] = []
        for k in range(hi - 1, -1, -1):
            out.extend(self._lines[k])
            # The reading before the window's start was still on screen when it began.
            if self._times[k] <= t_media - self.window_s:
                break
        return out

    def terms(
        self, t_media: float, token_count: TokenCount | None = None, limit: int = 20
    ) -> list[str]:
        """Distinct rare words on screen in the last `window_s`, newest first, at most `limit`."""
        seen: set[str] = set()
        out: list[str] = []
        for line in self.lines(t_media):
            for word in _WORD.findall(line):
                key = _key(word)
                if len(key) < self.min_chars or key in seen:
                    continue
                if token_count is not None and token_count(word) < 2:
                    continue  # one token: a common word, the model needs no help with it
                seen.add(key)
                out.append(word)
                if len(out) >= limit:
                    return out
        return out


def _stem(key: str) -> str:
    return key[:6]  # "electrons" ~ "electron", "matrices" ~ "matrix": crude, but cheap


def relevant(heard: Iterable[Word], shown: Iterable[str], min_overlap: int) -> bool:
    """Whether the speech so far is about what is on screen: at least `min_overlap` distinct
    words of 5+ letters (compared by their first 6 letters) both heard and shown.

    Priming towards another lecture's slides biases the decoder for nothing (measured: WER up
    on clips whose slides do not match the speech), so it waits for this evidence.
    """
    heard_stems = {_stem(w.key) for w in heard if len(w.key) >= 5}
    shown_stems = {_stem(_key(x)) for line in shown for x in _WORD.findall(line)}
    return len(heard_stems & {s for s in shown_stems if len(s) >= 5}) >= min_overlap


def drop_recited(words: Sequence[Word], terms: Sequence[str], *, min_run: int = 4) -> list[Word]:
    """Remove runs of `min_run` or more consecutive words that are all primed terms.

    Speech rarely strings several rare slide terms together without a function word between
    them; Whisper reciting its hotword list over noise does exactly that.
    """
    primed = {_key(t) for t in terms}
    if not primed:
        return list(words)
    out: list[Word] = []
    run: list[Word] = []
    for w in [*words, None]:
        if w is not None and w.key in primed:
            run.append(w)
            continue
        if len(run) < min_run:
            out.extend(run)
        run = []
        if w is not None:
            out.append(w)
    return out


def drop_unspoken_terms(
    words: Sequence[Word],
    terms: Sequence[str],
    speech_prob: Callable[[Word], float],
    min_speech: float,
) -> list[Word]:
    """Remove primed terms placed where the voice activity detector heard mostly no speech.

    `speech_prob(word)` is the mean speech probability over the word's span. A term echoed from
    the prompt lands in a pause (measured: mean ~0.3); a term that was said lies in speech (~0.9).
    """
    primed = {_key(t) for t in terms}
    return [w for w in words if w.key not in primed or speech_prob(w) >= min_speech]


__all__ = ["ScreenTerms", "TokenCount", "drop_recited", "drop_unspoken_terms", "relevant"]
