"""Configuration of the audio path (VAD + streaming ASR), validated with bounds."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from streamfuse.qos.effort import EffortControllerConfig


class AsrConfig(BaseModel):
    """VAD and streaming-ASR settings. Defaults target real time on a 2-core CPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        "tiny.en", description="Whisper model: 'tiny.en', 'base' or a CTranslate2 Whisper folder."
    )
    language: str | None = Field(
        "en", description="Spoken language code; None lets multilingual models detect it."
    )
    compute_type: Literal["int8", "int8_float32", "float32"] = Field(
        "int8", description="CTranslate2 compute type on CPU."
    )
    cpu_threads: int = Field(
        1,
        ge=1,
        le=64,
        description="Threads the Whisper model may use. One: a second thread barely speeds up "
        "tiny/base calls and takes the core OCR needs (figures: docs/design.md, defaults).",
    )
    beam_size: int = Field(
        1, ge=1, le=10, description="Beam width; 1 is greedy (the fastest decoding)."
    )
    full_beam_size: int = Field(
        1,
        ge=1,
        le=10,
        description="Beam width of full-window passes (at pauses, where words are committed); "
        "fast updates inside speech keep `beam_size`. The larger of the two is used.",
    )
    effort: Literal["auto", 0, 1, 2] = Field(
        0,
        description="Effort of the full-window passes (at pauses and utterance ends; fast "
        "updates are unchanged): 0 as configured, 1 beam search (`effort_beam`), 2 the accurate "
        "model (`effort_model`, Whisper base) at that beam; "
        "'auto' moves between them with the measured headroom (`effort_control`). 0 by "
        "default: no rung beat 0 on both speech-set splits and the bundled clip (docs/asr.md).",
    )
    effort_beam: int = Field(
        5, ge=1, le=10, description="Beam width of the full-window passes at effort rungs 1-2."
    )
    effort_model: str = Field(
        "base",
        description="The accurate model of effort rung 2's full-window passes (a name "
        "`resolve_whisper_model` knows, or a CTranslate2 Whisper folder).",
    )
    effort_model_shift_s: float = Field(
        0.18,
        ge=-1.0,
        le=1.0,
        description="Added to the word times of `effort_model`'s passes, so they keep the "
        "clock of the stream's model, whose committed words they are matched against by time: "
        "base places words 0.18 s earlier than tiny.en (median over 180 words both read on the "
        "bundled clip and the speech set's dev split). Unshifted, a word base heard centred "
        "inside a committed tiny.en word was taken as already committed and lost.",
    )
    background_revise: bool = Field(
        True,
        description="`effort_model` at `effort_beam` re-reads the audio of each utterance-end "
        "pass (lookback included) on a thread of the lowest CPU priority, after the stream's "
        "own model has committed it, and revises the words it reads differently "
        "(`asr_revision` events with `model` set); words it read are not revised again by the "
        "stream's model. First commits never wait for it. One reading at a time: an utterance "
        "that ends while it is busy waits, and a newer one replaces a waiting one (its lookback "
        "covers the utterances before it). Used with `effort` 0 only: the other rungs run "
        "their passes in the commit path instead. On by default since 2026-12-06: live, the "
        "speech set's final WER dev 41.4 -> 31.4%, held-out 33.5 -> 27.5%, bundled 0.0% both, "
        "first commits as fast (docs/asr.md, 'Background reviser').",
    )
    background_confidence: bool = Field(
        True,
        description="The background reviser replaces a stretch of committed words only where "
        "it reads it more confidently (mean log word probability, each model's own; as "
        "`revise_confidence` for the stream's own passes). Chosen on the dev split: 34.3 -> "
        "31.9% there; held-out 24.0 -> 26.5%, bundled 0.9 -> 0.0% (docs/asr.md).",
    )
    effort_control: EffortControllerConfig = Field(
        default_factory=EffortControllerConfig,
        description="Water marks and hysteresis of `effort='auto'` (`qos.effort`).",
    )
    calibrate: bool = Field(
        True,
        description="Publish each word's `p` through the shipped calibrator (P(the word is "
        "right), docs/calibration.md), keeping Whisper's word probability as `p_raw`. "
        "Thresholds in this config always apply to the raw probability.",
    )
    fast_updates: bool = Field(
        True,
        description="Updates inside speech encode only the buffered audio plus `context_pad_s` "
        "instead of Whisper's padded 30 s window: the encoder is ~75% of a call and shrinks "
        "several-fold, so hypotheses come faster. Their words are committed when two "
        "consecutive hypotheses agree on them (LocalAgreement-2, after `max_pending_s`) or once "
        "`max_word_delay_s` old; a full-window pass at each pause commits the rest.",
    )
    tail_window_min_s: float = Field(
        1.0,
        ge=0.0,
        le=30.0,
        description="faster-whisper reads the audio after a window's last word as one more "
        "window (a second encoder run over a padded 30 s window) unless the window ended on a "
        "lone timestamp; at a pause that tail is the pause's silence. A tail shorter than this "
        "is not read (0: always read, faster-whisper's behaviour). Measured: docs/asr.md, "
        "'The second window'.",
    )
    context_pad_s: float = Field(
        4.0, ge=0.0, le=25.0, description="Padding after the audio in a fast update, s."
    )
    max_pending_s: float = Field(
        0.5,
        ge=0.0,
        le=25.0,
        description="With fast updates: words are committed by agreement of consecutive fast "
        "hypotheses once speech has waited uncommitted this long (25: only at pauses). Chosen "
        "on the speech set's dev split: 0.5 s halves word latency at the same WER as 6 s.",
    )
    max_word_delay_s: float = Field(
        1.5,
        ge=0.0,
        le=25.0,
        description="A pending word that ended this long before the end of the audio of the "
        "latest hypothesis is committed as that hypothesis has it, agreed on or not (bounds the "
        "commit delay of words that keep changing; 0 disables). 1.5 s since 2026-12-05 "
        "(was 2.0): word end -> first commit p50 0.15-0.3 s lower on the harder speech set at "
        "the same final WER, but more words first committed wrong and revised at the "
        "utterance end (dev first-commit WER 58% -> 66%; docs/asr.md). 2.0: steadier first "
        "commits.",
    )
    agree_min_age_s: float = Field(
        0.5,
        ge=0.0,
        le=10.0,
        description="With fast updates: a word is committed by agreement only once it ended "
        "this long before the end of the audio transcribed (right context makes a short "
        "window's words reliable).",
    )
    age_each_window: bool = Field(
        True,
        description="With `max_word_delay_s`: pending words are aged at every audio window, "
        "not only when a new hypothesis comes: a word is committed once it ended "
        "`max_word_delay_s` before the newest audio (and `agree_min_age_s` before the end of "
        "the audio its hypothesis heard), instead of at the next update after that, once its "
        "inference has run (which added 0.2-1 s). Measured (docs/asr.md, 2026-12-05): "
        "first-commit p95 3.95 -> 2.67 s dev, 3.04 -> 2.70 s held-out at the same WER; "
        "False: the behaviour before.",
    )
    pause_commit: Literal["off", "all", "agreed"] = Field(
        "off",
        description="With fast updates: when the speaker pauses, a fast pass commits words "
        "heard before the pause at once (rule `pause_tail`), before the full-window pass that "
        "the utterance end reuses (~1 s over a long revision window; it then revises what it "
        "reads differently): 'all' its words, 'agreed' those the hypothesis before it agrees "
        "on (without the `agree_min_age_s` wait: the audio after them is silence). One more "
        "fast inference per pause. Off: 'all' repeated sentences of a dense reading on "
        "held-out (docs/asr.md, 2026-12-05).",
    )
    age_carry: bool = Field(
        False,
        description="With fast updates: a hypothesis that stops short of the pending words "
        "(a truncated or empty reading: common in noise) keeps them pending instead of "
        "dropping them, so `max_word_delay_s` still bounds their commit. Off: alone it cut "
        "dev's first-commit p95 3.95 -> 2.95 s at the same WER, but with `age_each_window` "
        "it raised dev WER 42.0% -> 50.9% (docs/asr.md, 2026-12-05).",
    )
    agree_min_p: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="With fast updates: a word committed by agreement of fast hypotheses needs "
        "at least this probability; a less certain word (and all after it) waits for the "
        "full-window pass at the next pause, which corrects it.",
    )
    update_interval_s: float = Field(
        0.5, ge=0.1, le=5.0, description="Re-transcribe the buffer after this much new audio."
    )
    coalesce_after_s: float = Field(
        0.5,
        ge=0.0,
        le=30.0,
        description="Live: interim updates are skipped (coalesced into the next) only while "
        "more than this much audio waits in the queue. Below it every update runs on its "
        "media-time schedule, so a live run that keeps up commits what an offline run does.",
    )
    pause_update_s: float = Field(
        0.2,
        ge=0.05,
        le=2.0,
        description="A pause this long inside speech triggers an update at once, so the "
        "hypothesis is ready to commit when the pause becomes an utterance end.",
    )
    vad_start_threshold: float = Field(
        0.5, gt=0.0, lt=1.0, description="Speech probability that starts an utterance."
    )
    vad_end_threshold: float = Field(
        0.35, gt=0.0, lt=1.0, description="Probability below which audio counts as silence."
    )
    min_silence_s: float = Field(
        0.4, ge=0.1, le=3.0, description="Silence that ends an utterance (commits everything)."
    )
    speech_pad_s: float = Field(
        0.2, ge=0.0, le=1.0, description="Audio kept before speech start and after speech end."
    )
    context_s: float = Field(
        8.0,
        ge=0.0,
        le=20.0,
        description="Recognised utterances kept in the buffer as audio context for the next "
        "one (cut at utterance ends; 0 restarts the buffer at each utterance end).",
    )
    trim_after_s: float = Field(
        8.0, ge=1.0, le=25.0, description="Trim the buffer at a committed sentence end past this."
    )
    max_buffer_s: float = Field(
        15.0, ge=2.0, le=28.0, description="Hard buffer limit: older words are committed and cut."
    )
    prompt_chars: int = Field(
        200, ge=0, le=1000, description="Committed text before the buffer passed as prompt."
    )
    no_speech_threshold: float = Field(
        0.6, ge=0.0, le=1.0, description="Drop a segment whose no-speech probability is above..."
    )
    logprob_threshold: float = Field(
        -1.0, le=0.0, description="...while its average log-probability is below this."
    )
    compression_ratio_threshold: float = Field(
        2.4,
        gt=1.0,
        le=10.0,
        description="Drop a segment whose text compresses better than "
        "this (gzip ratio): a repetition loop, not speech.",
    )
    silence_word_max_p: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Drop a word lying in VAD silence unless its probability is above this.",
    )
    trailing_word_min_p: float = Field(
        0.15,
        ge=0.0,
        le=1.0,
        description="A word after a sentence end in the last 1.5 s of the buffer with a "
        "probability below this starts a tail hallucination and is cut (0 disables).",
    )
    loop_ngram: int = Field(
        4,
        ge=0,
        le=12,
        description="A pass's words are cut from where a phrase of this many words starts "
        "that recurs three times within 32 words: Whisper's decoder loop, which noise sets "
        "off (tiny.en under babble: 'I'm going to be on the beach, and I'm going to be on the "
        "beach, and ...'); the compression-ratio check misses it when the loop is only part of "
        "a segment. 0 disables.",
    )
    emit_partials: bool = Field(True, description="Emit `asr_partial` events.")
    revise: bool = Field(
        True,
        description="At an utterance end, the full-window pass over the whole utterance "
        "corrects words committed before it: an `asr_revision` event replaces those it reads "
        "differently (docs/asr.md). Off: committed words never change.",
    )
    revise_min_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="No revision when the full pass heard fewer words than this share of the "
        "utterance's commits (it dropped the speech as silence or noise); with a lookback, a "
        "stretch of 3+ committed words read as fewer than this share is kept too.",
    )
    revise_lookback_s: float = Field(
        10.0,
        ge=0.0,
        le=28.0,
        description="With `revise`: the full pass at an utterance end also hears the audio of "
        "the utterances that ended within this many seconds before it (whole utterances; the "
        "pass stays one 30 s window) and revises their words too, now heard with what "
        "followed them (offline decoding's advantage); with `revise_window_s`, where a pass "
        "starts once the window is full. 0: only the current utterance.",
    )
    revise_window_s: float = Field(
        28.0,
        ge=0.0,
        le=28.0,
        description="With a lookback: a pass keeps the start of the lookback pass before it "
        "(first: the stream's start) while its audio stays within this many seconds, so a "
        "stretch is re-read from the same point as the speech after it grows, as offline "
        "decoding's 30 s windows are, instead of from a start that moves up with every "
        "utterance; past it, the start moves to the earliest utterance end within "
        "`revise_lookback_s`. At most `revise_lookback_s` (e.g. 0): the start always moves "
        "(the behaviour before 2026-12-03, night: lookback 20 s, window 0; docs/asr.md).",
    )
    commit_before_lookback: bool = Field(
        True,
        description="With a lookback: at a pause, the pass that commits the utterance's last "
        "words reads the buffer only (one 30 s window over the utterance and its context); "
        "the lookback pass over the revision window runs after the commit and revises. Off: "
        "one pass over the whole revision window commits and revises, so the last words of "
        "every utterance wait for it (its cost grows with the window: ~1.9 s for 22 s of "
        "audio on one AVX2 core, against ~0.4 s for the buffer). On by default since "
        "2026-12-07 with `lookback_async`; alone (the lookback in turn) it did not move word "
        "latency beyond the run-to-run spread and tiny.en worked 18% more (docs/asr.md).",
    )
    lookback_async: bool = Field(
        True,
        description="Live, with `commit_before_lookback`: the lookback pass runs on a second "
        "copy of the stream's model on its own thread, off the commit path, and revises when "
        "it lands (as the background reviser does), so the next utterance's passes never wait "
        "for it. Offline it runs in turn (the same revisions on every run). On by default "
        "since 2026-12-07: in live runs on an AVX2 CPU it brought the held-out set's word "
        "latency within 1.5 / 3.0 s (p50 / p95) where the pass in turn was just over; it "
        "loads a second copy of the model per stream (tiny.en int8: +58 MB resident; "
        "docs/asr.md).",
    )
    revise_confidence: bool = Field(
        False,
        description="A revision replaces a stretch of committed words only where the full pass "
        "reads it more confidently (higher mean log word probability, each reading as its own "
        "pass gave it).",
    )
    prime_max_terms: int = Field(
        20,
        ge=0,
        le=100,
        description="Slide priming: at most this many rare words read on screen are passed to "
        "Whisper as hotwords (rare: the tokenizer splits them); 0 disables priming. On by "
        "default since 2026-12-07 night, with `prime_stream` off (only the background "
        "reviser's readings primed): live, it lowered WER by 24.0% relative on lectures whose "
        "slides match (two runs), left speech under another lecture's slides and off-slide speech "
        "unchanged, and first commits as fast as unprimed (docs/asr.md, 'Priming the reviser "
        "only').",
    )
    prime_min_overlap: int = Field(
        0,
        ge=0,
        le=20,
        description="Slide priming starts once the speech of the last `prime_window_s` (committed "
        "and pending words) shares this many distinct 5+ letter words with the screen text "
        "(0: always prime). Priming from slides about something else only hurts.",
    )
    prime_min_speech: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Slide priming: a recognised word that is one of the primed terms is kept "
        "only where the VAD's mean speech probability over it reaches this (a term echoed from "
        "the prompt into a pause measured ~0.3, one that was said ~0.9).",
    )
    prime_lookback: bool = Field(
        True,
        description="Slide priming also on the utterance-end pass's lookback (the re-read of "
        "earlier utterances); off: that pass is unprimed, only the passes over the buffer are.",
    )
    prime_guard: Literal["off", "lookback", "full", "all", "score"] = Field(
        "full",
        description="Slide priming: which passes are read twice, unprimed and primed (the "
        "encoder output shared), the primed reading kept only where it hears a slide term in "
        "place of similar-sounding words (`priming.guard_primed`): 'full' (default) the "
        "full-window passes (at pauses and utterance ends: they commit and revise), 'lookback' "
        "those re-reading earlier utterances, 'all' every pass (twice the decoding: it falls "
        "behind on 2 cores). Passes the guard does not cover are read unprimed, until the "
        "slides are trusted (`prime_trust_terms`); 'off' reads every pass primed, unguarded "
        "(the comma list of terms then reaches the transcript as Whisper reads it: measured, "
        "it raised WER on speech that did not match the slides; docs/asr.md). 'score': no pass "
        "is read primed; terms get in only by `prime_check`.",
    )
    prime_check: bool = Field(
        True,
        description="Slide priming: the most accurate reading of each utterance (the background "
        "reviser's, else the full-window passes) is also checked by scoring "
        "(`priming.correct_terms`), however `prime_guard` read it: a slide term replaces words "
        "spelled like it where the model, teacher-forced over the sentence's audio, finds the "
        "sentence with it likelier and reads the term with p >= `prime_score_min_p`. Costs the "
        "reviser's thread about half its reading time again.",
    )
    prime_score_min_p: float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description="`prime_check`: the least geometric-mean token probability a slide "
        "term put in place of heard words must be read with (chosen on the dev split, where "
        "no candidate read with p >= 0.1 was a wrong term and the prompt alone made wrong ones "
        "likelier at 0.00-0.06; live, the terms taken were read with 0.31-0.99).",
    )
    prime_trust_terms: int = Field(
        2,
        ge=0,
        le=20,
        description="Slide priming: once the speech was heard saying this many distinct terms "
        "on screen (read unprimed, or taken by the guard) in the last `prime_window_s`, the "
        "slides carry the speech: the passes the guard covers are read as `prime_trusted` "
        "says, every other pass primed only (0: never; `prime_guard='score'` reads no pass "
        "primed).",
    )
    reread_unprimed_first: bool = Field(
        True,
        description="Slide priming with a background reader: a reading that decodes unprimed and "
        "primed (guarded or merged) lands its unprimed words first, as an unprimed reading "
        "would (stretches holding a slide term left alone), and the primed decode and the guard "
        "after, reusing that unprimed decode; a term the guard puts in place of those words was "
        "judged against them (no confidence check). The primed reading's second decode no "
        "longer delays the span's revisions. Live, where slides match: 87 -> 70 word errors "
        "against the one-landing reading (99 unprimed); mismatched and off-slide clips "
        "unchanged (docs/asr.md, 'The unprimed reading lands first').",
    )
    prime_trusted: Literal["primed", "merged"] = Field(
        "merged",
        description="Slide priming, once the slides are trusted (`prime_trust_terms`): how a "
        "pass the guard covers is read. 'merged' (default): unprimed and primed as the guard "
        "reads it, and a stretch of up to 4 words the primed reading hears as a term is taken "
        "however it is spelled ('Thanks to a' -> 'Dijkstra's'; `guard_primed(trusted=True)`); "
        "'primed': primed only, as Whisper reads it (it also trades common words for terms and "
        "imitates the prompt: 'the prior' -> 'the priors'). Measured on the simulated clock, "
        "matching clips, 95 word errors unprimed: 'primed' 88, 'merged' 81 (docs/asr.md).",
    )
    prime_fast: bool = Field(
        True,
        description="Slide priming also on the fast updates inside speech; off: only the "
        "full-window passes (at pauses and utterance ends, the ones that revise) are primed.",
    )
    prime_stream: bool = Field(
        False,
        description="Slide priming also on the stream's own passes (the words first committed); "
        "off (the default since 2026-12-07 night): with the background reviser, only its "
        "readings are primed (guarded and checked as `prime_guard` and `prime_check` say), so "
        "first commits never wait for a primed decode and the slide terms get in as "
        "revisions. Without a reviser (`effort` other than 0), the stream's passes are primed "
        "whatever this says. On, in one live run beside off: matching slides -29.6% instead of "
        "-23.5%, but the dev first-commit p95 3.3 s instead of 2.9 s (two decodes per full "
        "pass).",
    )
    prime_window_s: float = Field(
        60.0, ge=1.0, le=600.0, description="Slide priming: terms on screen this recently."
    )

    @model_validator(mode="after")
    def _check(self) -> AsrConfig:
        if self.vad_end_threshold > self.vad_start_threshold:
            raise ValueError(
                f"vad_end_threshold ({self.vad_end_threshold}) must not exceed "
                f"vad_start_threshold ({self.vad_start_threshold})"
            )
        if self.trim_after_s > self.max_buffer_s:
            raise ValueError(
                f"trim_after_s ({self.trim_after_s}) must not exceed max_buffer_s "
                f"({self.max_buffer_s})"
            )
        if self.pause_update_s >= self.min_silence_s:
            raise ValueError(
                f"pause_update_s ({self.pause_update_s}) must be shorter than min_silence_s "
                f"({self.min_silence_s})"
            )
        return self

    @property
    def revises_in_background(self) -> bool:
        """Whether the background reviser runs: `background_revise`, with `effort` 0 and a
        stream model other than `effort_model` (base reading base again would change nothing)."""
        return self.background_revise and self.effort == 0 and self.model != self.effort_model

    @property
    def checks_terms(self) -> bool:
        """Whether the most accurate reading of each utterance is checked for slide terms by
        scoring: `prime_check`, or `prime_guard='score'` (where it is the only way in)."""
        return self.prime_check or self.prime_guard == "score"


__all__ = ["AsrConfig"]
