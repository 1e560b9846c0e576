"""Versioned KV in the live path (F19): the timeline keys its lines and revises a slide's
window; the `lm` stage keeps its context as those windows, so a revised window is recomputed
from there on while the unchanged prefix is reused (tiny model, real engine and KV pool)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import torch

from streamfuse.events import EventType, OcrLine, OcrPayload
from streamfuse.frames import ContextFrame, EventFrame, Frame, TextFrame
from streamfuse.fusion import TimelineConfig, TimelineStage
from streamfuse.lm.config import LMConfig
from streamfuse.lm.engine import LMEngine
from streamfuse.lm.gemma import GemmaModel, Segment
from streamfuse.lm.stage import LMStage, LMStageConfig
from streamfuse.testing import run_stage
from streamfuse.testing.tiny_lm import CharTokenizer, tiny_model

pytestmark = pytest.mark.unit

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def model() -> GemmaModel:
    return tiny_model(weights="int8", seed=1)


def line(key: str, version: int, text: str, t: float = 0.0) -> ContextFrame:
    return ContextFrame(
        stream_id="s", t_media=t, t_end=t + 1, text=text, window=key, version=version
    )


def stage_for(model: GemmaModel, max_tokens: int = 256) -> LMStage:
    lm = LMConfig.model_validate({"pool": {"num_slots": 2, "max_tokens": max_tokens}})
    cfg = LMStageConfig(lm=lm, max_new_tokens=4, stop_at_newline=False)
    return LMStage(cfg, engine=LMEngine(model, lm), tokenizer=TOK)


async def push(stage: LMStage, frames: Sequence[Frame]) -> list[Frame]:
    """Frames through `process` one by one (a prompt returns once its answer is complete)."""
    out: list[Frame] = []
    for f in frames:
        out.extend([o async for o in stage.process(f)])
    return out


def answers(out: list[Frame]) -> list[str]:
    return [
        str(f.to_record()["text"])
        for f in out
        if isinstance(f, EventFrame) and f.type == EventType.LM
    ]


def test_a_revised_window_is_recomputed_from_there_and_the_prefix_reused(model: GemmaModel) -> None:
    stage = stage_for(model)
    a = "NOTES\n[0.0s] SLIDE: Sales rose.\n"
    b, b2 = "[1.0s] SPEECH: we think so\n", "[1.0s] SPEECH: we know it is\n"
    c = "[2.0s] SPEECH: next year\n"
    engine = stage.engine
    assert engine is not None
    ask = TextFrame(stream_id="s", text="how?")

    async def scenario() -> tuple[list[Frame], dict[str, int], list[int]]:
        await stage.setup()
        try:
            await push(
                stage, [line("slide:1", 0, a), line("speech:2", 0, b), line("speech:3", 0, c)]
            )
            await push(stage, [ask])
            st = engine.stats
            before = {"reused": st.reused_tokens, "recomputed": st.recomputed_tokens,
                      "invalidations": st.invalidations}  # fmt: skip
            out = await push(stage, [line("speech:2", 1, b2), ask])
            delta = {"reused": st.reused_tokens - before["reused"],
                     "recomputed": st.recomputed_tokens - before["recomputed"],
                     "invalidations": st.invalidations - before["invalidations"]}  # fmt: skip
            return out, delta, engine.session_context("s")
        finally:
            await stage.teardown()

    out, delta, context = asyncio.run(asyncio.wait_for(scenario(), 120))
    ids_a, ids_b2, ids_c = TOK.encode(a, add_bos=True), TOK.encode(b2), TOK.encode(c)
    # The revision replaced B in place (not appended after C) ...
    assert context == [*ids_a, *ids_b2, *ids_c]
    # ... the feed recomputed B' and C (C attended to the old B) and reused A; the question
    # then reused all of it.
    assert delta == {
        "recomputed": len(ids_b2) + len(ids_c),
        "reused": len(ids_a) + len(context),
        "invalidations": 1,
    }
    # The slot holds what a fresh prefill of the revised context computes (no stale rows).
    s = engine.sessions.get("s")
    assert s is not None and s.slot is not None
    ref = model.kv_pool(num_slots=1, max_tokens=256)
    model.forward(torch.tensor(context), [Segment(0, 0, len(context))], ref)
    n = len(context)
    for li in range(model.config.num_layers):
        torch.testing.assert_close(engine.pool.k[li][s.slot.index, :, :n], ref.k[li][0, :, :n])
        torch.testing.assert_close(engine.pool.v[li][s.slot.index, :, :n], ref.v[li][0, :, :n])
    # And the answer is the one over the revised context.
    question = TOK.encode(stage.config.question_template.format(prompt="how?"))
    fresh = LMEngine(model, stage.config.lm).generate(
        [*context, *question], 4, stop_ids=TOK.stop_ids
    )
    assert answers(out) == [TOK.decode(fresh).strip()]


def test_windows_outgrowing_the_slot_drop_the_oldest_but_keep_the_first(model: GemmaModel) -> None:
    stage = stage_for(model, max_tokens=80)  # room for 20 context tokens (a quarter of the slot)
    engine = stage.engine
    assert engine is not None
    texts = ["HEAD\n", *(f"line {i}\n" for i in range(8))]

    async def scenario() -> list[int]:
        await stage.setup()
        try:
            await push(stage, [line(f"k{i}", 0, t) for i, t in enumerate(texts)])
            await push(stage, [TextFrame(stream_id="s", text="q")])
            return engine.session_context("s")
        finally:
            await stage.teardown()

    context = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert len(context) <= 20
    assert context[: len(TOK.encode(texts[0], add_bos=True))] == TOK.encode(texts[0], add_bos=True)
    newest = TOK.encode(texts[-1])
    assert context[-len(newest) :] == newest  # the newest line is always kept
    assert engine.stats.truncations == 0  # the engine never had to cut the windows itself


def test_unkeyed_text_gets_a_window_and_a_late_older_revision_is_ignored(
    model: GemmaModel,
) -> None:
    stage = stage_for(model)
    engine = stage.engine
    assert engine is not None
    plain = ContextFrame(stream_id="s", t_media=0.0, t_end=1.0, text="plain\n")

    async def scenario() -> list[int]:
        await stage.setup()
        try:
            await push(stage, [plain, line("k", 0, "old\n"), line("k", 2, "new\n")])
            await push(stage, [line("k", 1, "stale\n"), plain])  # late revision; more text
            await push(stage, [TextFrame(stream_id="s", text="q")])
            return engine.session_context("s")
        finally:
            await stage.teardown()

    context = asyncio.run(asyncio.wait_for(scenario(), 120))
    # Unkeyed text is appended each time (a key of its own); "k" holds its newest version.
    want = [*TOK.encode("plain\n", add_bos=True), *TOK.encode("new\n"), *TOK.encode("plain\n")]
    assert context == want


def slide(t: float, text: str) -> EventFrame:
    payload = OcrPayload(
        lines=[OcrLine(text=text, box=(0, 0, 10, 10), conf=1.0)], text=text, n_lines=1,
        resolution=(64, 64), scale=1.0, roi=(0, 0, 64, 64), ocr_ms=1.0, mean_conf=1.0,
        frame_index=0, t_changed=t, reason="change",
    )  # fmt: skip
    return EventFrame(stream_id="s", t_media=t, t_end=t + 0.5, payload=payload)


def test_the_timeline_revises_a_slide_read_again_and_keys_every_line() -> None:
    from streamfuse.events import AsrPayload

    speech = EventFrame(
        stream_id="s", t_media=1.0, t_end=2.0, payload=AsrPayload(text="welcome", words=[])
    )
    stage = TimelineStage(TimelineConfig(header="H\n", checkpoint_every_s=1000.0))
    frames: list[Frame] = [
        slide(0.0, "Agenda"),
        speech,
        slide(3.0, "Agenda Intro Results"),  # the same slide, built up: a revision
        slide(5.0, "Budget 2027 costs"),  # another slide: a new window
        slide(6.0, "Budget 2027 costs"),  # read again unchanged: nothing
    ]
    out = [f for f in asyncio.run(run_stage(stage, frames)) if isinstance(f, ContextFrame)]
    assert [(f.window, f.version, f.text) for f in out] == [
        ("slide:1", 0, "H\n[0.0s] SLIDE: Agenda\n"),
        ("speech:2", 0, "[1.0s] SPEECH: welcome\n"),
        ("slide:1", 1, "H\n[0.0s] SLIDE: Agenda Intro Results\n"),  # its place and time kept
        ("slide:3", 0, "[5.0s] SLIDE: Budget 2027 costs\n"),
    ]
    assert [f.checkpoint for f in out] == [True, False, True, True]
    never = TimelineStage(TimelineConfig(slide_revision_similarity=None))
    plain = [f for f in asyncio.run(run_stage(never, frames[:3])) if isinstance(f, ContextFrame)]
    assert [f.window for f in plain] == ["slide:1", "speech:2", "slide:3"]


def test_trimmed_windows_are_cut_out_of_the_cache_without_recomputing_the_rest(
    model: GemmaModel,
) -> None:
    """Windows outgrowing the slot: the oldest are dropped and the KV of the later ones moves
    into the gap, so every line is prefilled once however often the stage trims (with
    `removed_windows: recompute` everything after a dropped window is prefilled again)."""
    texts = ["HEAD\n", *(f"line {i}\n" for i in range(40))]
    budget = 160 - 4 - 64  # the slot less room for a question and its answer

    def run(removed: str) -> tuple[int, int, list[int], int]:
        lm = LMConfig.model_validate({
            "pool": {"num_slots": 2, "max_tokens": 160},
            "truncation": {"removed_windows": removed},
        })  # fmt: skip
        cfg = LMStageConfig(lm=lm, max_new_tokens=4, stop_at_newline=False)
        stage = LMStage(cfg, engine=LMEngine(model, lm), tokenizer=TOK)
        engine = stage.engine
        assert engine is not None

        async def scenario() -> list[int]:
            await stage.setup()
            try:
                await push(stage, [line(f"k{i}", 0, t) for i, t in enumerate(texts)])
                await push(stage, [TextFrame(stream_id="s", text="q")])  # after all the lines
                return engine.session_context("s")
            finally:
                await stage.teardown()

        context = asyncio.run(asyncio.wait_for(scenario(), 120))
        st = engine.stats
        return st.prefill_tokens, st.moved_tokens, context, st.truncations

    fed = len(TOK.encode(texts[0], add_bos=True)) + sum(len(TOK.encode(t)) for t in texts[1:])
    fed += len(TOK.encode(LMStageConfig().question_template.format(prompt="q")))
    prefilled, moved, context, truncations = run("move")
    assert prefilled == fed  # each line once: nothing recomputed
    assert moved > 0 and truncations == 0
    head = TOK.encode(texts[0], add_bos=True)
    newest = TOK.encode(texts[-1])
    assert context[: len(head)] == head and context[-len(newest) :] == newest
    assert budget // 2 < len(context) <= budget  # dropped to 3/4 of the budget, not half
    prefilled_exact, moved_exact, context_exact, _ = run("recompute")
    assert moved_exact == 0 and prefilled_exact > fed  # what followed a dropped window, again
    assert context_exact[: len(head)] == head
