"""The real tiny.en streaming stage over the short test clip, through a Pipeline + CollectSink."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from streamfuse.audio import AsrConfig, AsrStage
from streamfuse.pipeline import Pipeline
from streamfuse.sinks import CollectSink
from streamfuse.sources.media import MediaSource
from streamfuse.text import normalize_english

pytestmark = pytest.mark.integration

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "test"


def test_tiny_en_transcribes_the_short_clip_with_word_times() -> None:
    truth = json.loads((ASSETS / "short.truth.json").read_text())
    sink = CollectSink()
    stage = AsrStage(AsrConfig(model="tiny.en"))
    source = MediaSource(ASSETS / "short.mp4", video=False)  # as fast as possible
    pipeline = Pipeline().link(source, stage, maxsize=3000).link(stage, sink)
    asyncio.run(pipeline.run())

    assert not sink.of_type("error")
    asr = sink.of_type("asr")
    said = set(normalize_english(" ".join(r["text"] for r in asr)).split())
    # Content words of the truth (4+ letters): tiny.en may miss one, not more.
    content = {w for u in truth["asr"] for w in normalize_english(u["text"]).split() if len(w) >= 4}
    missing = sorted(content - said)
    assert len(content) >= 8
    assert len(missing) <= max(1, len(content) // 10), f"missing {missing} from {sorted(said)}"

    intervals = [(u["t_start"] - 1.0, u["t_end"] + 1.0) for u in truth["asr"]]
    words = [w for r in asr for w in r["words"]]
    assert len(words) >= 20
    for w in words:
        assert w["t_start"] <= w["t_end"]
        assert 0.0 <= w["p"] <= 1.0
        assert any(a <= w["t_start"] and w["t_end"] <= b for a, b in intervals), w
    starts = [w["t_start"] for w in words]
    assert starts == sorted(starts)
    for r in asr:
        assert r["t_start"] == r["words"][0]["t_start"] and r["t_end"] == r["words"][-1]["t_end"]
        assert r["latency_ms"] >= 0.0
