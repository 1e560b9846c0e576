"""The vision path end to end on the bundled short clip: media source -> ChangeDetector ->
OcrStage -> CollectSink. Every truth slide is read (small CER) and yields exactly one `ocr`
event, and the moving mouse pointer never causes another."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from streamfuse.pipeline import OverloadPolicy, Pipeline
from streamfuse.sinks import CollectSink
from streamfuse.sources.media import MediaSource
from streamfuse.text import cer
from streamfuse.vision import ChangeDetector, FixedPolicy, OcrStage, VisionConfig

pytestmark = pytest.mark.integration

VISION_STAGES = ("change_detector", "ocr_stage")


def run_vision(clip: Path, *, realtime: bool, policy: OverloadPolicy) -> CollectSink:
    cfg = VisionConfig(policy=FixedPolicy())
    source = MediaSource(clip, audio=False, realtime=realtime)
    change, ocr, sink = ChangeDetector(cfg), OcrStage(cfg), CollectSink()
    pipe = (
        Pipeline()
        .link(source, change, maxsize=64)
        .link(change, ocr, policy=policy, maxsize=4)
        .link(ocr, sink)
    )
    asyncio.run(pipe.run())
    return sink


def check_slides(sink: CollectSink, truth: dict[str, Any]) -> None:
    errors = [r for r in sink.records if r["type"] == "error" and r["stage"] in VISION_STAGES]
    assert not errors, errors
    events = sink.of_type("ocr")
    for slide in truth["ocr"]:
        inside = [e for e in events if slide["t_start"] <= e["t_start"] < slide["t_end"]]
        assert len(inside) == 1, (slide, [e["text"] for e in inside])
        ref = " ".join(slide["lines"])
        hyp = " ".join(ln["text"] for ln in inside[0]["lines"])
        assert cer(ref, hyp) <= 0.05, (ref, hyp)
        for ln in inside[0]["lines"]:
            x0, y0, x1, y1 = ln["box"]
            assert 0 <= x0 < x1 <= 1280 and 0 <= y0 < y1 <= 720
    assert len(events) == len(truth["ocr"])
    # The detector looks at the frame at 960 px wide at most (the content region of it).
    assert all(max(e["resolution"]) <= 960 for e in events)


def test_each_slide_of_the_short_clip_is_read_once(assets: Path) -> None:
    clip, truth_path = assets / "test" / "short.mp4", assets / "test" / "short.truth.json"
    truth = json.loads(truth_path.read_text())
    # As fast as possible, OCR must see every key frame: a lossless link here. Live runs use
    # LATEST_ONLY (next test), where the source's pace leaves OCR time for every slide.
    sink = run_vision(clip, realtime=False, policy=OverloadPolicy.BLOCK)
    check_slides(sink, truth)
    first = sink.of_type("ocr")[0]
    assert first["reason"] == "first" and first["t_start"] == 0.0


@pytest.mark.slow
def test_short_clip_live_with_latest_only(assets: Path) -> None:
    clip, truth_path = assets / "test" / "short.mp4", assets / "test" / "short.truth.json"
    truth = json.loads(truth_path.read_text())
    sink = run_vision(clip, realtime=True, policy=OverloadPolicy.LATEST_ONLY)
    check_slides(sink, truth)
