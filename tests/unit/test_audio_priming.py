"""Slide priming: which on-screen words become hotwords, from which events; the recital guard."""

from __future__ import annotations

import pytest

from streamfuse.audio import ScreenTerms, Word
from streamfuse.audio.priming import (
    correct_terms,
    count_terms,
    drop_recited,
    drop_unspoken_terms,
    guard_primed,
    read_primed,
)
from streamfuse.events import OcrLine, OcrPayload
from streamfuse.frames import EventFrame
from streamfuse.pipeline import FrameEmitted

pytestmark = pytest.mark.unit

# A stand-in tokenizer: these words take several tokens (rare), any other word one.
RARE = {"gradient", "kubernetes", "kubelet", "cholesky", "factorisation", "schedules"}


def _count(word: str) -> int:
    return 3 if word.lower() in RARE else 1


def test_terms_are_rare_distinct_recent_and_newest_first() -> None:
    terms = ScreenTerms(window_s=60.0)
    terms.add(["Gradient descent", "learning rate schedules"], 0.0)
    terms.add(["Kubernetes scheduling", "kubelet on every node"], 50.0)
    terms.add(["Cholesky factorisation"], 130.0)
    # Before the second slide: only the first one, only its rare words.
    assert terms.terms(10.0, _count) == ["Gradient", "schedules"]
    # At 100 s the first slide is 100 s old but was on screen until 50 s: inside the window.
    assert terms.terms(100.0, _count) == ["Kubernetes", "kubelet", "Gradient", "schedules"]
    # At 200 s the second slide left the screen 70 s ago: only the newest one counts.
    assert terms.terms(200.0, _count) == ["Cholesky", "factorisation"]
    # No look-ahead: a slide shown later never primes earlier audio.
    assert "Cholesky" not in terms.terms(129.9, _count)
    assert terms.terms(100.0, _count, limit=2) == ["Kubernetes", "kubelet"]
    # Without a tokenizer every word of min_chars letters or more is a term; no duplicates.
    terms.add(["KUBERNETES again"], 140.0)
    assert terms.terms(140.0) == [
        "KUBERNETES",
        "again",
        "Cholesky",
        "factorisation",
        "scheduling",
        "kubelet",
        "every",
        "node",
    ]


def _ocr_event(stream_id: str, t: float, lines: list[tuple[str, float]]) -> FrameEmitted:
    payload = OcrPayload(
        lines=[OcrLine(text=text, box=(0, 0, 10, 10), conf=conf) for text, conf in lines],
        text="\n".join(text for text, _ in lines),
        n_lines=len(lines),
        resolution=(640, 360),
        scale=0.5,
        roi=(0, 0, 1280, 720),
        ocr_ms=10.0,
        mean_conf=0.9,
        frame_index=0,
        t_changed=t,
        reason="test",
    )
    frame = EventFrame(stream_id=stream_id, t_media=t, t_end=t, arrival_wall=0.0, payload=payload)
    return FrameEmitted(producer=None, frame=frame, wall=0.0)  # type: ignore[arg-type]


def test_observer_takes_confident_ocr_lines_of_its_own_stream() -> None:
    terms = ScreenTerms("lecture")
    terms.on_frame(_ocr_event("lecture", 5.0, [("Dijkstra heuristic", 0.95), ("Xqzzy", 0.2)]))
    terms.on_frame(_ocr_event("other", 6.0, [("Bellman Ford", 0.99)]))
    assert terms.terms(10.0) == ["Dijkstra", "heuristic"]
    assert terms.terms(4.0) == []


def _words(text: str) -> list[Word]:
    return [Word(" " + w, i * 0.3, i * 0.3 + 0.25) for i, w in enumerate(text.split())]


def test_a_recited_run_of_terms_is_dropped_a_spoken_phrase_kept() -> None:
    terms = ["Kubernetes", "etcd", "kubelet", "autoscaler", "Gram", "Schmidt", "orthogonalisation"]
    recited = _words("so Kubernetes, etcd, kubelet, autoscaler. and then")
    assert [w.word.strip() for w in drop_recited(recited, terms)] == ["so", "and", "then"]
    spoken = _words("use Gram Schmidt orthogonalisation on kubelet logs")
    assert drop_recited(spoken, terms) == spoken
    assert drop_recited(recited, []) == recited


def test_a_primed_term_in_a_pause_is_dropped_one_in_speech_kept() -> None:
    words = [
        Word(" Lecture", 15.9, 16.2, 0.46),  # echoed from the slide into a pause
        Word(" The", 17.2, 17.4, 0.84),
        Word(" Kubernetes", 17.4, 18.0, 0.93),
        Word(" um", 18.0, 18.3, 0.45),  # not primed: left to the other filters
    ]

    def speech(w: Word) -> float:  # the VAD heard a pause from 15.5 to 17.0 s
        return 0.1 if w.t_end < 17.0 else 0.9

    kept = drop_unspoken_terms(words, ["LECTURE", "Kubernetes"], speech, 0.5)
    assert [w.word for w in kept] == [" The", " Kubernetes", " um"]
    assert drop_unspoken_terms(words, [], speech, 0.5) == words


def _slots(text: str) -> list[Word]:
    """Words 0.4 s apart; a word written "a|b" spans two slots (said as the two words were)."""
    out, t = [], 0.0
    for w in text.split():
        slots = w.count("|") + 1
        out.append(Word(" " + w.replace("|", ""), t, t + 0.4 * slots - 0.1))
        t += 0.4 * slots
    return out


def test_guard_takes_a_primed_term_only_in_place_of_words_spelled_like_it() -> None:
    terms = ["Kubernetes", "etcd", "taints", "Electron", "transport", "priors"]

    def guarded(plain: str, primed: str) -> str:
        return " ".join(w.word.strip() for w in guard_primed(_slots(plain), _slots(primed), terms))

    # A misheard term (one word or several) becomes the term the slide shows, or a form of it.
    assert guarded("Cuban eat-srun containers", "Kubernetes runs containers") == (
        "Kubernetes runs containers"
    )
    assert guarded("keeps state in etsy.", "keeps state in etcd.") == "keeps state in etcd."
    assert (
        guarded("Ten generations| keep", "Taint and tolerations keep")
        == "Taint and tolerations keep"
    )
    # Primed changes that are no slide terms keep the unprimed words.
    assert guarded("the control plane keeps", "a control plane keep") == "the control plane keeps"
    # An inserted run of terms (nothing unprimed at their time) is rejected...
    assert guarded("runs pods", "Kubernetes, etcd, runs pods") == "runs pods"
    # ... and so is a term in place of words that sound nothing like it, or the prompt's comma
    # list imitated over speech about something else.
    assert guarded("tells how strongly", "transport how strongly") == "tells how strongly"
    assert guarded("keep it away", "keep taints away") == "keep it away"  # "it": too short
    assert guarded(
        "electronegativity|| tells| how strongly", "Electron, the thibity, the tail, how strongly"
    ) == ("electronegativity tells how strongly")
    # Where the unprimed reading has a form of a term already, priming has nothing to add.
    assert guarded("the prior taint", "the priors taints") == "the prior taint"
    # Unprimed: the plain reading as it is.
    assert guard_primed(_slots("a b"), _slots("c d"), []) == _slots("a b")


def test_trusted_slides_take_a_short_stretch_heard_as_a_term_however_it_is_spelled() -> None:
    terms = ["Dijkstra's", "Bellman", "priors", "Hastings"]

    def merged(plain: str, primed: str, *, trusted: bool = True) -> str:
        words = guard_primed(_slots(plain), _slots(primed), terms, trusted=trusted)
        return " ".join(w.word.strip() for w in words)

    # Spelled nothing like the term, yet what the slides say: taken once they are trusted
    # (the guard alone keeps the unprimed words)...
    assert merged("Thanks to a algorithm", "Dijkstra's algorithm") == "Dijkstra's algorithm"
    assert merged("Thanks to a algorithm", "Dijkstra's algorithm", trusted=False) == (
        "Thanks to a algorithm"
    )
    # ... but primed words that are no terms, a form of a term heard unprimed, an insertion
    # and a long stretch keep the unprimed reading.
    assert merged("the posterior has", "of the pastly area that has") == "the posterior has"
    assert merged("the prior by the", "the priors by the") == "the prior by the"
    assert merged("Hastings accepts", "casings accept, sub-reposal") == "Hastings accepts"
    assert merged("runs pods", "Bellman, runs pods") == "runs pods"
    assert merged("a b c d e f", "Bellman") == "a b c d e f"


def test_terms_are_counted_with_their_forms() -> None:
    words = ["the", "taint", "and", "the", "taints", "on", "the", "kubelet"]
    said = count_terms(words, ["taints", "Kubelet"])
    assert said == {"taints": 2, "kubelet": 1}
    assert not count_terms(["the", "pods"], ["etcd"])


class ScriptedScore:
    """A stand-in for `Transcriber.score`: each word's (log p, tokens) from a table (other
    words -0.1 if they were heard, -6 if not), and, as the audio of a word left out stays
    unexplained, -5 on the first word for each word fewer than the first text scored (the
    transcript as heard). Records what it was asked to score."""

    def __init__(self, log_p: dict[str, float]) -> None:
        self.log_p = log_p
        self.asked: list[list[str]] = []
        self.heard_words: set[str] = set()
        self.spans: list[tuple[float, float]] = []

    def __call__(
        self, t0: float, t1: float, before: str, texts: list[list[str]]
    ) -> list[list[tuple[float, int]]]:
        if len(texts) > 1:  # a sentence as heard, then with each candidate term
            self.heard = len(texts[0])
            self.heard_words |= {w.strip(".,").lower() for w in texts[0]}
            self.spans.append((t0, t1))
        self.asked.extend(texts)
        out = []
        for text in texts:
            keys = [w.strip(".,").lower() for w in text]
            default = [-0.1 if k in self.heard_words else -6.0 for k in keys]
            scores = [(self.log_p.get(k, d), 1) for k, d in zip(keys, default, strict=True)]
            scores[0] = (scores[0][0] - 5.0 * max(0, self.heard - len(text)), 1)
            out.append(scores)
        return out


def _text(words: list[Word]) -> str:
    return " ".join(w.word.strip() for w in words)


def test_a_term_heard_surer_replaces_the_words_spelled_like_it_and_nothing_else() -> None:
    heard = _words("the membrane folds into Christy to gain surface area.")
    # "cristae" read with p 0.5 makes the transcript likelier than "Christy" (p 0.05).
    score = ScriptedScore({"christy": -3.0, "cristae": -0.7})
    out, n = correct_terms(heard, ["cristae", "Mitochondria"], score)
    assert n == 1
    assert _text(out) == "the membrane folds into cristae to gain surface area."
    cristae = out[4]
    assert (cristae.t_start, cristae.t_end) == (heard[4].t_start, heard[4].t_end)
    assert cristae.p == pytest.approx(0.5, abs=0.01)
    # Only stretches that spell like a term were scored (and the transcript as heard).
    assert score.asked[0] == [w.word.strip() for w in heard]
    assert all(len(t) <= len(heard) for t in score.asked)


def test_each_candidate_is_scored_over_its_own_sentence() -> None:
    heard = _words("we use the goalscordy factor. so we stop. the asian inference holds.")
    score = ScriptedScore({"goalscordy": -4.0, "cholesky": -0.3, "asian": -3.0, "bayesian": -0.2})
    out, n = correct_terms(heard, ["Cholesky", "Bayesian"], score)
    assert n == 2
    assert _text(out) == "we use the Cholesky factor. so we stop. the Bayesian inference holds."
    # Two sentences scored, each over its own words' audio (0.2 s either side); the one
    # without a candidate not at all.
    first, second = [w.word.strip() for w in heard[:5]], [w.word.strip() for w in heard[8:]]
    assert score.asked[0] == first and second in score.asked
    assert score.spans[0] == pytest.approx((heard[0].t_start - 0.2, heard[4].t_end + 0.2))
    assert ["so", "we", "stop."] not in score.asked


def test_a_term_the_prompt_alone_makes_likelier_is_not_taken() -> None:
    heard = _words("assigned to it.")
    # Likelier as a whole, but the term itself read unsure (p 0.15): rejected.
    score = ScriptedScore({"to": -4.0, "it": -4.0, "taints": -1.9})
    out, n = correct_terms(heard, ["taints"], score, min_similarity=0.5, min_p=0.3)
    assert (n, out) == (0, heard)
    # Sure of it, but the transcript as heard is likelier: kept too.
    score = ScriptedScore({"to": -0.1, "it": -0.1, "taints": -0.5})
    assert correct_terms(heard, ["taints"], score, min_similarity=0.5)[1] == 0


def test_a_stretch_holding_a_slide_term_is_never_replaced_by_another_term() -> None:
    heard = _words("cytochrome c oxidase passes electrons")
    score = ScriptedScore({"oxidative": -0.01, "oxidase": -9.0})
    out, n = correct_terms(heard, ["Oxidative", "oxidase", "cytochrome"], score)
    assert (n, out) == (0, heard)


def test_several_terms_in_one_reading_are_all_taken() -> None:
    heard = _words("the goalscordy factor and the asian inference")
    score = ScriptedScore({"goalscordy": -4.0, "cholesky": -0.3, "asian": -3.0, "bayesian": -0.2})
    out, n = correct_terms(heard, ["Cholesky", "Bayesian"], score)
    assert n == 2
    assert _text(out) == "the Cholesky factor and the Bayesian inference"


def test_no_scorer_no_correction() -> None:
    heard = _words("the cumulative starts")
    assert correct_terms(heard, ["kubelet"], lambda *args: None) == (heard, 0)
    assert correct_terms(heard, [], ScriptedScore({})) == (heard, 0)


def test_a_primed_reading_is_checked_too_when_asked() -> None:
    """With `check`, a guarded or primed reading is scored like an unprimed one: the guard took
    "Kubernetes" (the primed decode heard it), the check adds "cristae" that neither decode
    got; without `check` no reading is."""
    plain = _words("cube and eighties folds into Christy")
    primed = _words("Kubernetes folds into Christy")
    terms = ["Kubernetes", "cristae"]

    def transcribe(hotwords: list[str] | None = None) -> list[Word]:
        return list(primed if hotwords else plain)

    def score(_terms: object) -> ScriptedScore:
        return ScriptedScore({"christy": -3.0, "cristae": -0.7})

    words, used = read_primed(transcribe, "guarded", terms, score, check=True)
    assert _text(words) == "Kubernetes folds into cristae" and used == terms
    words, used = read_primed(transcribe, "guarded", terms, score)
    assert _text(words) == "Kubernetes folds into Christy"
    words, used = read_primed(transcribe, "plain", terms, score)
    assert _text(words) == _text(plain) and used == []
    words, used = read_primed(transcribe, "plain", terms, score, check=True)
    assert _text(words) == "cube and eighties folds into cristae" and used == terms
