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
echoing its prompt into a pause); `guard_primed` keeps an unprimed decode of the same audio except
where the primed one hears a term in place of similar-sounding words (Whisper imitating the form
of its prompt over speech that does not match the slides).
"""

from __future__ import annotations

import bisect
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from difflib import SequenceMatcher
from functools import partial
from typing import TYPE_CHECKING, Literal

import numpy as np

from streamfuse.audio.policy import Word
from streamfuse.events import OcrPayload
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ, EventFrame
from streamfuse.pipeline import FrameEmitted, Observer

if TYPE_CHECKING:
    from streamfuse.audio.transcriber import Transcriber

log = logging.getLogger(__name__)

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


def _sounds_alike(a: str, b: str) -> float:
    """Letter similarity of two spellings (0-1), with the commonest sound-alike spellings
    folded ("c"/"k", "ph"/"f", doubled letters): "cube and eighties" ~ "Kubernetes" 0.7."""
    return SequenceMatcher(None, _fold(a), _fold(b), autojunk=False).ratio()


_FOLDS = (("ph", "f"), ("ck", "k"), ("c", "k"), ("q", "k"), ("z", "s"), ("y", "i"))


def _fold(text: str) -> str:
    for old, new in _FOLDS:
        text = text.replace(old, new)
    return re.sub(r"(.)\1+", r"\1", text)


def _term_of(key: str, terms: Iterable[str]) -> str | None:
    """The slide term (key) a word (its key) is, or is a form of: "taint" ~ "taints",
    "electrons" ~ "electron", "eigenvalues" inside "realeigenvalues"; None if none."""
    for term in terms:
        shorter = min(len(key), len(term))
        if shorter >= 4 and key[: min(6, shorter)] == term[: min(6, shorter)]:
            return term
        if len(term) >= 5 and term in key:
            return term
    return None


def _is_term(key: str, terms: set[str]) -> bool:
    return _term_of(key, terms) is not None


def _overlaps(w: Word, term: Word, slack_s: float = 0.1) -> bool:
    """Whether `w` was heard where `term` was: its middle within the term's span, or the
    term's middle within its span."""
    mid, term_mid = (w.t_start + w.t_end) / 2, (term.t_start + term.t_end) / 2
    return term.t_start - slack_s <= mid <= term.t_end + slack_s or (
        w.t_start <= term_mid <= w.t_end
    )


#: A stretch of at most this many words each side that spells alike as a whole
#: (`_SHORT_SIMILARITY`) is taken whole, the words around its term included.
_SHORT = 3
_SHORT_SIMILARITY = 0.6
#: Trusted slides (`guard_primed(trusted=True)`): a stretch of at most this many unprimed
#: words with no term in it, read as a term by the primed decode, is taken whole.
_TRUSTED_STRETCH = 4


def guard_primed(
    plain: Sequence[Word],
    primed: Sequence[Word],
    terms: Sequence[str],
    *,
    min_similarity: float = 0.5,
    trusted: bool = False,
) -> list[Word]:
    """The unprimed reading of some audio, corrected by the primed reading only where the
    primed one hears a slide term in place of similar-sounding words.

    `plain` and `primed` are two decodes of the same audio, without and with the terms in the
    prompt. Priming helps where it turns a misheard term ("cube and eighties") into the term
    ("Kubernetes"); where the speech is about something else it makes Whisper imitate its
    prompt (a comma list, or the terms themselves) and changes words that are no terms. So
    where the readings differ, a primed word that is a term (or a form of one) replaces the
    unprimed words heard at its time when they spell like it (`min_similarity`, letters
    compared after folding sound-alike spellings), and a short stretch holding a term that
    spells like the unprimed one as a whole is taken whole ("Ten generations" -> "Taint and
    tolerations"); a term with no unprimed word at its time (an insertion), a stretch where the
    unprimed reading has a form of a term already ("prior" for "priors", "electronegativity"
    for "Electron") and every other primed word that is no term are rejected: the unprimed
    words stay. `trusted` (the speech was heard saying the slides' terms lately): a stretch of
    at most `_TRUSTED_STRETCH` unprimed words with no term in it is taken whole where the
    primed reading hears a term there, however it is spelled ("Thanks to a" -> "Dijkstra's").
    """
    keys = {_key(t) for t in terms}
    keys.discard("")
    if not keys:
        return list(plain)
    out: list[Word] = []
    ops = SequenceMatcher(None, [w.key for w in plain], [w.key for w in primed], autojunk=False)
    for tag, i1, i2, j1, j2 in ops.get_opcodes():
        old, new = list(plain[i1:i2]), list(primed[j1:j2])
        if tag != "replace" or not any(_is_term(w.key, keys) for w in new):
            out.extend(old)  # equal, an insertion (rejected), a deletion (kept), no term
            continue
        if any(_is_term(w.key, keys) for w in old):
            out.extend(old)  # unprimed it heard a form of a term there already ("prior")
            continue
        if trusted and len(old) <= _TRUSTED_STRETCH and len(new) <= len(old) + 1:
            out.extend(new)  # the slides carry the speech: "Thanks to a" -> "Dijkstra's"
            continue
        if (
            len(new) <= min(len(old) + 1, _SHORT)
            and len(old) <= _SHORT
            and _sounds_alike("".join(w.key for w in old), "".join(w.key for w in new))
            >= _SHORT_SIMILARITY
        ):
            out.extend(new)  # a short stretch said alike: "Cuban eat-srun" -> "Kubernetes runs"
            continue
        taken: dict[int, Word] = {}  # index of the first unprimed word replaced -> the term
        gone: set[int] = set()
        for term in (w for w in new if _is_term(w.key, keys)):
            heard = [k for k, w in enumerate(old) if k not in gone and _overlaps(w, term)]
            spelled = "".join(old[k].key for k in heard)
            # At least half the term's letters: "it" shares half of its letters' worth with
            # "taints" (similarity 0.5) but is no misheard "taints".
            if (
                heard
                and 2 * len(_fold(spelled)) >= len(_fold(term.key))
                and _sounds_alike(spelled, term.key) >= min_similarity
            ):
                taken[heard[0]] = term
                gone.update(heard)
        for k, w in enumerate(old):
            if k in taken:
                out.append(taken[k])
            elif k not in gone:
                out.append(w)
    return out


#: Texts scored over part of some audio: `score(t0, t1, before, texts)` gives, for each text
#: (its words) read as the audio from `t0` to `t1` s after the text `before`, each word's
#: summed token log probability and its number of tokens; None where the model cannot score.
#: (`scorer` makes one from `Transcriber.score`.)
TextScore = Callable[[float, float, str, Sequence[Sequence[str]]], "Scores | None"]
Scores = list[list[tuple[float, int]]]

#: The longest stretch of heard words one slide term may replace ("cube and eighties").
_MAX_STRETCH = 3
#: Candidates scored per reading (the most alike first): bounds the scoring cost.
_MAX_CANDIDATES = 12
#: A candidate is scored over its sentence (its words and their audio): a sentence longer
#: than this many words is cut to this many around the stretch.
_MAX_BLOCK = 24
#: Audio kept either side of a sentence's first and last word (word times are approximate).
_PAD_S = 0.2


def scorer(
    score: Callable[..., Scores | None],
    audio: np.ndarray,
    prompt: str,
    terms: Sequence[str],
) -> TextScore:
    """A `TextScore` over `audio` (its own clock) from a `Transcriber.score`: the part of the
    audio cut out, read after `prompt` and the words before it, with `terms` as hotwords."""

    def part(t0: float, t1: float, before: str, texts: Sequence[Sequence[str]]) -> Scores | None:
        rate = AUDIO_SAMPLE_RATE_HZ
        cut = audio[max(0, int(t0 * rate)) : int(t1 * rate)]
        return score(cut, f"{prompt} {before}".strip(), texts, hotwords=terms)

    return part


def correct_terms(
    words: Sequence[Word],
    terms: Sequence[str],
    score: TextScore,
    *,
    min_similarity: float = 0.5,
    min_p: float = 0.3,
    margin: float = 0.0,
) -> tuple[list[Word], int]:
    """`words` (an unprimed reading of some audio) with a slide term put in place of a stretch
    of them where the model itself hears the term there; and how many terms were put.

    Candidates are lexical: a stretch of up to three words that spells like a term or its
    singular/plural (`min_similarity` after folding sound-alike spellings; "Might a laundry" ~
    "Mitochondria", "Christy" ~ "cristae") and holds no slide term already. Each is checked
    against the audio of its sentence: `score` gives the log probability of the sentence as
    heard and with the term, teacher-forced over the same encoding (with the terms as hotwords,
    as a primed decode reads), and the term is taken only where the sentence with it is more
    likely by more than `margin` nats AND the term's own tokens are read with a mean (geometric)
    probability of at least `min_p`: the prompt alone can make a slide term likelier than a
    misheard stretch ("assigned to it" -> "assigned taints"), but then the model reads the term
    itself unsure. So, unlike a primed decode, the words around a term are never re-read.
    Where several terms are taken in one sentence, the sentence with all of them must beat the
    best single one; else only that one is kept.
    """
    keys = {_key(t) for t in terms} - {""}
    alike = sorted(
        (
            (similarity, i, j, form)
            for term in dict.fromkeys(terms)
            for form in _forms(term)
            for similarity, i, j in _stretches_like(words, _key(form), keys, min_similarity)
        ),
        key=lambda c: -c[0],
    )
    candidates = [(i, j, form) for _, i, j, form in alike[:_MAX_CANDIDATES]]
    taken: list[tuple[int, int, str, float]] = []  # (i, j, form, the term's p)
    for (a, b), inside in sorted(_blocks(words, candidates).items()):
        texts = [w.word.strip() for w in words[a:b]]
        local = [(i - a, j - a, form) for i, j, form in inside]
        t0, t1 = words[a].t_start - _PAD_S, words[b - 1].t_end + _PAD_S
        before = " ".join(w.word.strip() for w in words[:a])
        scores = score(t0, t1, before, [texts, *(_with_terms(texts, [c]) for c in local)])
        if scores is None:
            return list(words), 0
        for i, j, form, p in _best_terms(
            texts, local, scores, min_p, margin, score, (t0, t1, before)
        ):
            taken.append((i + a, j + a, form, p))
    out: list[Word] = []
    done = 0
    for i, j, form, p in sorted(taken):
        stretch = words[i:j]
        out.extend(words[done:i])
        end = form + _trailing_punctuation(stretch[-1].word)
        out.append(Word(end, stretch[0].t_start, stretch[-1].t_end, p, checked=True))
        done = j
    out.extend(words[done:])
    return out, len(taken)


def _blocks(
    words: Sequence[Word], candidates: Sequence[tuple[int, int, str]]
) -> dict[tuple[int, int], list[tuple[int, int, str]]]:
    """The candidates grouped by the stretch of words each is scored over: its sentence (at
    most `_MAX_BLOCK` words around it), sentences two candidates share merged."""
    starts = [0] + [k + 1 for k, w in enumerate(words[:-1]) if w.ends_sentence]
    spans = []
    for i, j, _ in candidates:
        a = max(s for s in starts if s <= i)
        b = min([s for s in starts if s >= j] + [len(words)])
        if b - a > _MAX_BLOCK:
            half = (_MAX_BLOCK - (j - i)) // 2
            a, b = max(a, i - half), min(b, j + half)
        spans.append([a, b])
    # Merge overlapping spans (each candidate keeps the merged span it falls in).
    order = sorted(range(len(spans)), key=lambda k: spans[k][0])
    merged: list[list[int]] = []
    owner: dict[int, int] = {}
    for k in order:
        if merged and spans[k][0] < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], spans[k][1])
        else:
            merged.append(list(spans[k]))
        owner[k] = len(merged) - 1
    out: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    for k, c in enumerate(candidates):
        a, b = merged[owner[k]]
        out.setdefault((a, b), []).append(c)
    return out


def _best_terms(
    texts: list[str],
    candidates: list[tuple[int, int, str]],
    scores: Scores,
    min_p: float,
    margin: float,
    score: TextScore,
    where: tuple[float, float, str],
) -> list[tuple[int, int, str, float]]:
    """The candidates of one sentence to take, with each term's p (`correct_terms`' rules)."""
    heard = _total(scores[0])
    ranked = sorted(((_total(s) - heard, k) for k, s in enumerate(scores[1:])), key=lambda g: -g[0])
    taken: list[int] = []
    for gain, k in ranked:
        i, j, _ = candidates[k]
        log_p, n_tokens = scores[k + 1][i]
        fits = all(j <= candidates[t][0] or i >= candidates[t][1] for t in taken)
        if gain > margin and log_p / max(1, n_tokens) >= math.log(min_p) and fits:
            taken.append(k)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "term check %r -> %r: %+.1f nats, term p %.2f%s",
                " ".join(texts[i:j]), candidates[k][2], gain,
                math.exp(log_p / max(1, n_tokens)), " (taken)" if k in taken else "",
            )  # fmt: skip
    if len(taken) > 1:
        both = score(*where, [_with_terms(texts, [candidates[k] for k in taken])])
        if both is None or _total(both[0]) - heard <= ranked[0][0]:
            taken = taken[:1]
    out = []
    for k in taken:
        i, j, form = candidates[k]
        log_p, n_tokens = scores[k + 1][i]  # the term's own score, in the sentence with it
        out.append((i, j, form, math.exp(log_p / max(1, n_tokens))))
    return out


def _total(word_scores: Sequence[tuple[float, int]]) -> float:
    return sum(log_p for log_p, _ in word_scores)


def _forms(term: str) -> list[str]:
    """A term and its plural or singular ("Taints" / "Taint"): the speech may say either."""
    if term.endswith("s") and len(term) > 4:
        return [term, term[:-1]]
    return [term, term + "s"]


def _stretches_like(
    words: Sequence[Word], key: str, terms: set[str], min_similarity: float
) -> list[tuple[float, int, int]]:
    """Stretches `words[i:j]` (up to `_MAX_STRETCH` words, inside a sentence) that spell like
    the term `key`, hold no form of a slide term (`terms`), and have between half and twice its
    letters, as `(similarity, i, j)`: the most alike one per starting word."""
    folded = len(_fold(key))
    best: dict[int, tuple[float, int]] = {}
    for i in range(len(words)):
        for j in range(i + 1, min(i + _MAX_STRETCH, len(words)) + 1):
            if _is_term(words[j - 1].key, terms) or (j - 1 > i and words[j - 2].ends_sentence):
                break  # a slide term there already, or across a sentence end
            spelled = "".join(w.key for w in words[i:j])
            if not spelled or not folded <= 2 * len(_fold(spelled)) <= 4 * folded:
                continue
            similarity = _sounds_alike(spelled, key)
            if similarity >= min_similarity and similarity > best.get(i, (0.0, 0))[0]:
                best[i] = (similarity, j)
    return [(similarity, i, j) for i, (similarity, j) in best.items()]


def _trailing_punctuation(word: str) -> str:
    return word[len(word.rstrip(".,!?;:")) :]


def _with_terms(texts: Sequence[str], stretches: Sequence[tuple[int, int, str]]) -> list[str]:
    """`texts` with each stretch `(i, j, form)` replaced by `form` (keeping its punctuation)."""
    out: list[str] = []
    done = 0
    for i, j, form in sorted(stretches):
        out.extend(texts[done:i])
        out.append(form + _trailing_punctuation(texts[j - 1]))
        done = j
    out.extend(texts[done:])
    return out


def count_terms(words: Iterable[str], terms: Iterable[str]) -> Counter[str]:
    """How often each slide term (its key) occurs in `words`, a form of it counting as the
    term ("taints" for "taint")."""
    keys = {k for k in (_key(t) for t in terms) if k}
    return Counter(t for t in (_term_of(_key(w), keys) for w in words) if t is not None)


#: How a pass reads with slide terms: unprimed, primed only, or both with `guard_primed`
#: (merged: the slides trusted).
PrimingMode = Literal["plain", "primed", "guarded", "merged"]


def read_primed(
    transcribe: Callable[..., list[Word]],
    mode: PrimingMode,
    terms: Sequence[str],
    score: Callable[[Sequence[str]], TextScore] | None = None,
    *,
    min_p: float = 0.3,
    check: bool = False,
    unprimed: list[Word] | None = None,
) -> tuple[list[Word], list[str]]:
    """One pass's words read as `mode` says (`transcribe(hotwords=...)` decodes the pass's
    audio), and the terms it was primed with or checked against ([]: neither). Guarded, it is
    decoded unprimed and primed and `guard_primed` keeps the unprimed reading but where the
    primed one hears a term in place of words spelled like it (Whisper encodes the audio once);
    merged, as guarded with the slides trusted (`guard_primed(trusted=True)`). `unprimed`: the
    unprimed decode of the same audio and prompt, already made (not decoded again).
    With `check`, whatever the mode, the reading is then corrected by `correct_terms`: a term
    goes where the scorer `score(terms)` gives (the same audio teacher-forced, `scorer`) hears
    it in place of words spelled like it, read with p >= `min_p`."""
    if not terms:
        return transcribe(), []
    used: list[str] = list(terms)
    if mode == "primed":
        words = transcribe(hotwords=terms)
    elif mode in ("guarded", "merged"):
        heard = transcribe() if unprimed is None else unprimed
        words = guard_primed(heard, transcribe(hotwords=terms), terms, trusted=mode == "merged")
    else:
        words = transcribe()
        used = []
    if check and score is not None:
        words, _ = correct_terms(words, terms, score(terms), min_p=min_p)
        used = list(terms)
    return words, used


def read_pass(
    transcriber: Transcriber,
    audio: np.ndarray,
    prompt: str,
    mode: PrimingMode,
    terms: Sequence[str],
    *,
    check: bool,
    min_p: float,
    fast: bool = False,
    unprimed: list[Word] | None = None,
) -> tuple[list[Word], list[str]]:
    """`read_primed` over `audio` with `transcriber` (its decodes and, for the check, its
    `Transcriber.score`): the one way the stream's passes and the reviser's readings are read."""
    transcribe = partial(transcriber.transcribe, audio, prompt, fast=fast)
    score = partial(scorer, transcriber.score, audio, prompt)
    return read_primed(transcribe, mode, terms, score, min_p=min_p, check=check, unprimed=unprimed)


__all__ = [
    "PrimingMode",
    "ScreenTerms",
    "TokenCount",
    "correct_terms",
    "scorer",
    "count_terms",
    "drop_recited",
    "drop_unspoken_terms",
    "guard_primed",
    "read_pass",
    "read_primed",
    "relevant",
]
