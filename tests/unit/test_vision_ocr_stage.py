"""OCR stage logic with a scripted engine (the model boundary): junk filtering, reading order,
text-state de-duplication, ROI merging and the resolution policy hook."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from streamfuse.frames import EventFrame, Frame
from streamfuse.pipeline import OverloadPolicy, Pipeline
from streamfuse.pipeline.source import Source
from streamfuse.sinks import CollectSink
from streamfuse.testing import run_stage, run_virtual
from streamfuse.text.calibration import calibrate_ocr_line, shipped
from streamfuse.vision import (
    FixedPolicy,
    FixedResolution,
    KeyFrame,
    OcrConfig,
    OcrEngine,
    OcrLine,
    OcrObservation,
    OcrPlan,
    OcrReading,
    OcrStage,
    ResolutionPolicy,
    VisionConfig,
    normalize_text,
    reading_order,
    same_text_state,
)
from streamfuse.vision.ocr import clean_lines

pytestmark = pytest.mark.unit


def line(text: str, x0: float, y0: float, x1: float, y1: float, conf: float = 0.99) -> OcrLine:
    return OcrLine(text, (x0, y0, x1, y1), conf)


# -- reading order ---------------------------------------------------------------------------


def texts(lines: Sequence[OcrLine]) -> list[str]:
    return [ln.text for ln in lines]


def test_single_column_reads_top_to_bottom() -> None:
    lines = [
        line("third", 100, 300, 500, 340),
        line("title", 300, 50, 900, 110),
        line("second", 100, 240, 700, 280),
        line("first", 110, 180, 600, 220),
    ]
    assert texts(reading_order(lines)) == ["title", "first", "second", "third"]


def test_two_columns_under_a_title_read_left_column_first() -> None:
    # The bundled two-column slide, as the detector boxes it (slightly ragged edges).
    lines = [
        line("Audio path and video path", 338, 61, 941, 121),
        line("Audio", 103, 189, 221, 236),
        line("Video", 681, 188, 795, 234),
        line("20 ms windows", 105, 262, 327, 298),
        line("30 frames per second", 683, 259, 984, 302),
        line("Voice activity detection", 108, 312, 435, 348),
        line("Change detection", 688, 312, 931, 348),
        line("Streaming speech model", 107, 360, 445, 396),
        line("Text recognition", 684, 360, 919, 400),
        line("footer spanning the page", 100, 600, 1100, 640),
    ]
    shuffled = [lines[i] for i in (5, 0, 9, 2, 7, 1, 4, 8, 3, 6)]
    assert texts(reading_order(shuffled)) == [
        "Audio path and video path",
        "Audio",
        "20 ms windows",
        "Voice activity detection",
        "Streaming speech model",
        "Video",
        "30 frames per second",
        "Change detection",
        "Text recognition",
        "footer spanning the page",
    ]


def test_a_row_split_by_the_detector_stays_one_row() -> None:
    lines = [
        line("300 ms", 700, 376, 800, 420),
        line("Latency budget", 123, 376, 420, 420),
        line("Every stage keeps up", 121, 322, 808, 365),
    ]
    assert texts(reading_order(lines)) == ["Every stage keeps up", "Latency budget", "300 ms"]


def test_slightly_tilted_row_is_read_left_to_right() -> None:
    lines = [line("right", 500, 108, 700, 148), line("left", 100, 100, 300, 140)]
    assert texts(reading_order(lines)) == ["left", "right"]


# -- junk and text states ----------------------------------------------------------------------


def test_junk_lines_are_dropped() -> None:
    cfg = OcrConfig()
    lines = [
        line("Real text", 10, 10, 200, 40, 0.98),
        line("   ", 10, 50, 200, 80, 0.99),
        line("blurry", 10, 90, 200, 120, 0.3),
        line("4", 900, 400, 930, 440, 0.65),  # a mouse pointer read as a glyph
        line("42", 10, 130, 60, 160, 0.97),  # a confident short line stays
        line("speck", 10, 170, 60, 173, 0.99),  # 3 px high
        line("  two   spaces ", 10, 200, 200, 230, 0.95),
    ]
    assert texts(clean_lines(lines, cfg)) == ["Real text", "42", "two spaces"]


def test_same_text_state_tolerates_small_noise_only() -> None:
    a = [line("Latency budget 300 ms", 0, 0, 1, 1), line("Summary", 0, 2, 1, 3)]
    noisy = [line("Latency budget 300ms", 0, 0, 1, 1), line("summary", 0, 2, 1, 3)]
    edited = [line("Latency budget 180 ms", 0, 0, 1, 1), line("Summary", 0, 2, 1, 3)]
    reworded = [line("Latency target 300 ms", 0, 0, 1, 1), line("Summary", 0, 2, 1, 3)]
    split = [
        line("Latency budget", 0, 0, 1, 1),
        line("300 ms", 0, 0, 1, 1),
        line("Summary", 0, 2, 1, 3),
    ]
    assert same_text_state(a, noisy)
    assert not same_text_state(a, edited)  # numbers must match exactly
    assert not same_text_state(a, reworded)
    assert same_text_state(a, split)
    assert not same_text_state(a, a[:1])
    assert same_text_state([], [])
    assert normalize_text("  A \n b\tC ") == "a b c"


# -- the stage with a scripted engine ----------------------------------------------------------


@dataclass
class Call:
    shape: tuple[int, ...]
    det_max_side_px: int


class ScriptedEngine(OcrEngine):
    """Returns scripted readings in order (boxes relative to the image it is given)."""

    def __init__(self, readings: list[list[OcrLine]]) -> None:
        self.readings = list(readings)
        self.calls: list[Call] = []
        self.loaded = False

    def load(self) -> None:
        self.loaded = True

    def read(self, image: np.ndarray, det_max_side_px: int) -> OcrReading:
        self.calls.append(Call(image.shape, det_max_side_px))
        h, w = image.shape[:2]
        s = min(1.0, det_max_side_px / max(w, h))
        return OcrReading(tuple(self.readings.pop(0)), (round(w * s), round(h * s)), 12.5)


def key(i: int, t: float, *, w: int = 1280, h: int = 720) -> KeyFrame:
    return KeyFrame(
        t_media=t,
        arrival_wall=100.0 + t,
        image=np.zeros((h, w, 3), dtype=np.uint8),
        index=i,
        changed_bbox=(0, 0, w, h),
        t_changed=t - 0.1,
    )


async def read_keys(stage: OcrStage, keys: list[KeyFrame]) -> list[EventFrame]:
    out = await run_stage(stage, keys)
    assert all(isinstance(f, EventFrame) for f in out), out
    return [f for f in out if isinstance(f, EventFrame)]


def test_stage_emits_one_event_per_distinct_text_state() -> None:
    slide_a = [line("Title A", 100, 50, 600, 110), line("first point", 100, 200, 400, 240)]
    slide_a_noisy = [line("Title A", 101, 51, 600, 110), line("first poinl", 100, 200, 400, 240)]
    slide_b = [line("Title B", 100, 50, 600, 110)]
    engine = ScriptedEngine([slide_a, slide_a_noisy, slide_b, []])
    stage = OcrStage(engine=engine)
    events = asyncio.run(read_keys(stage, [key(0, 0.0), key(30, 1.0), key(60, 2.0), key(90, 3.0)]))
    assert engine.loaded
    assert [e.payload.fields()["text"] for e in events] == ["Title A\nfirst point", "Title B", ""]
    first = events[0]
    assert first.type == "ocr" and first.t_media == 0.0 and first.t_end == 0.0
    assert first.arrival_wall == 100.0  # latency runs from the key frame's arrival
    assert first.payload.fields()["lines"][0] == {
        "text": "Title A",
        "box": [100, 50, 600, 110],
        # calibrated (docs/calibration.md) from what the event records; the raw score kept
        "conf": calibrate_ocr_line(
            shipped("ocr"),
            "Title A",
            (100, 50, 600, 110),
            0.99,
            scale=0.75,
            mean_conf=0.99,
            n_lines=2,
        ),
        "conf_raw": 0.99,
        "gap_bridged": 0.0,  # one box, no table: the layout's calibration features
        "inferred_cuts": 0,
    }
    assert first.payload.fields()["resolution"] == [960, 540]
    assert first.payload.fields()["n_lines"] == 2 and first.payload.fields()["ocr_ms"] == 12.5
    assert (
        first.payload.fields()["roi"] == [0, 0, 1280, 720]
        and first.payload.fields()["scale"] == 0.75
    )
    assert events[2].payload.fields()["lines"] == []  # the text went away: that is a new state too
    record = first.to_record(emitted_wall=100.5)
    assert record["latency_ms"] == 500.0 and record["t_start"] == 0.0


class RoiPolicy(ResolutionPolicy):
    """Reads only the changed region after the first frame, at a lower resolution."""

    def __init__(self) -> None:
        self.observations: list[OcrObservation] = []

    def plan(self, key: KeyFrame) -> OcrPlan:
        if key.reason == "first":
            return OcrPlan(det_max_side_px=640)
        return OcrPlan(det_max_side_px=320, roi=key.changed_bbox)

    def observe(self, obs: OcrObservation) -> None:
        self.observations.append(obs)


def test_policy_chooses_resolution_and_roi_and_sees_feedback() -> None:
    full = [line("Title", 100, 50, 600, 110), line("old bullet", 100, 400, 500, 440)]
    # Boxes of the ROI reading are relative to the ROI crop (x0=80, y0=380).
    in_roi = [line("new bullet", 20, 20, 480, 60, 0.9)]
    engine = ScriptedEngine([full, in_roi])
    policy = RoiPolicy()
    stage = OcrStage(engine=engine, policy=policy)
    k0 = key(0, 0.0)
    k0 = KeyFrame(**{**_fields(k0), "reason": "first"})
    k1 = KeyFrame(**{**_fields(key(30, 1.0)), "changed_bbox": (80, 380, 700, 460)})
    events = asyncio.run(read_keys(stage, [k0, k1]))
    # 320 px for the 1280-px frame is a 1/4 scale: the 620x80 ROI is detected at 155 px.
    assert [c.det_max_side_px for c in engine.calls] == [640, 155]
    assert engine.calls[1].shape == (80, 620, 3)  # only the ROI was read
    second = events[1].payload.fields()
    assert [ln["text"] for ln in second["lines"]] == ["Title", "new bullet"]
    assert second["lines"][1]["box"] == [100, 400, 560, 440]  # back in frame pixels
    assert second["roi"] == [80, 380, 700, 460]
    assert [o.resolution for o in policy.observations] == [(640, 360), (155, 20)]
    assert policy.observations[1].n_lines == 2
    assert policy.observations[0].mean_conf == pytest.approx(0.99)
    assert all(o.ocr_ms == 12.5 for o in policy.observations)


def test_content_crop_reads_only_the_content_and_drops_nothing_outside() -> None:
    old = [line("old text", 900, 600, 1200, 650)]
    engine = ScriptedEngine([old, [line("Only text", 10, 10, 310, 50)]])
    policy = FixedResolution(960, content_crop=True)
    stage = OcrStage(engine=engine, policy=policy)
    # The first reading has a line outside the next content region: with a content crop
    # nothing can be there any more, so it is not carried over.
    k0 = KeyFrame(**{**_fields(key(0, 0.0)), "content_bbox": (0, 0, 1280, 720)})
    k1 = KeyFrame(**{**_fields(key(30, 1.0)), "content_bbox": (100, 200, 740, 440)})
    events = asyncio.run(read_keys(stage, [k0, k1]))
    assert [ln["text"] for ln in events[0].payload.fields()["lines"]] == ["old text"]
    assert engine.calls[1].shape == (240, 640, 3)
    assert engine.calls[1].det_max_side_px == 480  # the frame's 0.75 scale applied to 640 px
    assert [ln["text"] for ln in events[1].payload.fields()["lines"]] == ["Only text"]
    assert events[1].payload.fields()["lines"][0]["box"] == [110, 210, 410, 250]
    blank = KeyFrame(**{**_fields(key(0, 0.0)), "content_bbox": None})
    assert policy.plan(blank).roi is None


def _fields(k: KeyFrame) -> dict[str, object]:
    return {name: getattr(k, name) for name in KeyFrame.__dataclass_fields__}


def test_min_interval_lets_a_newer_key_frame_replace_a_waiting_one() -> None:
    """Under LATEST_ONLY, key frames that come faster than the interval collapse to the
    newest one, and the last picture is still read."""

    class Keys(Source):
        def __init__(self, keys: list[KeyFrame]) -> None:
            super().__init__("keys")
            self.keys = keys

        async def frames(self) -> AsyncIterator[Frame]:
            for k in self.keys:
                yield k
                await asyncio.sleep(0.01)

    readings = [[line(f"slide {i}", 10, 10, 300, 50)] for i in range(6)]
    engine = ScriptedEngine(readings)
    stage = OcrStage(engine=engine, policy=FixedResolution(960, min_interval_s=0.2))
    sink = CollectSink()
    keys = [key(i, i / 30) for i in range(6)]  # six key frames within ~60 ms
    pipe = Pipeline().link(Keys(keys), stage, policy=OverloadPolicy.LATEST_ONLY).link(stage, sink)
    run_virtual(pipe.run())
    events = sink.of_type("ocr")
    assert len(engine.calls) == 2  # key 0 at once; keys 1-5 within 0.2 s collapse to key 5
    assert events[0]["text"] == "slide 0"
    assert events[-1]["frame_index"] == 5  # the newest picture was read in the end


def test_engine_failure_becomes_an_error_event_and_the_stage_goes_on() -> None:
    class Flaky(ScriptedEngine):
        def read(self, image: np.ndarray, det_max_side_px: int) -> OcrReading:
            if not self.calls:
                self.calls.append(Call(image.shape, det_max_side_px))
                raise RuntimeError("onnxruntime exploded")
            return super().read(image, det_max_side_px)

    class Keys(Source):
        async def frames(self) -> AsyncIterator[Frame]:
            yield key(0, 0.0)
            await asyncio.sleep(0.05)
            yield key(30, 1.0)

    engine = Flaky([[line("still here", 10, 10, 300, 50)]])
    stage = OcrStage(engine=engine)
    sink = CollectSink()
    pipe = Pipeline().link(Keys("keys"), stage, policy=OverloadPolicy.LATEST_ONLY).link(stage, sink)
    run_virtual(pipe.run())
    assert [r["type"] for r in sink.records] == ["error", "ocr"]
    assert "onnxruntime exploded" in sink.records[0]["message"]
    assert sink.records[1]["text"] == "still here"


def test_stage_accepts_the_vision_config() -> None:
    cfg = VisionConfig(ocr=OcrConfig(min_conf=0.7), policy=FixedPolicy(det_max_side_px=640))
    stage = OcrStage(cfg, engine=ScriptedEngine([]))
    assert stage.config.min_conf == 0.7
    assert stage.policy.plan(key(0, 0.0)).det_max_side_px == 640


def test_plan_validation() -> None:
    from streamfuse.errors import ConfigError

    with pytest.raises(ConfigError):
        OcrPlan(det_max_side_px=8)
    with pytest.raises(ConfigError):
        OcrPlan(roi=(10, 10, 5, 20))


def test_auto_precision_is_one_rule_for_the_stage_and_the_app() -> None:
    from streamfuse.app import StreamfuseConfig, share_cores
    from streamfuse.vision.ocr import RapidOcrEngine

    auto = OcrConfig()
    assert auto.resolve_precision(1) == "fp32" and auto.resolve_precision(4) == "int8"
    assert OcrConfig(precision="int8").resolve_precision(1) == "int8"
    assert OcrConfig(precision="fp32").resolve_precision(4) == "fp32"
    # A stage built on its own reads one stream: the FP32 a single-stream job of the app loads
    # (it used to mean INT8 in the library and FP32 in the app).
    assert RapidOcrEngine(auto).precision == "fp32"
    assert RapidOcrEngine(auto, streams=3).precision == "int8"
    for n in (1, 4):
        resolved = share_cores(StreamfuseConfig(), n)[0].ocr
        assert RapidOcrEngine(resolved).precision == RapidOcrEngine(auto, streams=n).precision


def test_detector_size_follows_rapidocr_rounding() -> None:
    from streamfuse.vision.ocr import _det_size

    # rapidocr rounds each side with Python's round(), ties to even: 752 / 32 = 23.5 -> 24
    # (768) but 400 / 32 = 12.5 -> 12 (384).
    assert _det_size(752, 400, 960) == (768, 384)
    assert _det_size(1280, 720, 960) == (960, 544)
    assert _det_size(3, 2, 960) == (32, 32)
