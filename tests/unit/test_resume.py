"""Resume and shutdown pieces: the events file is read back across a torn last line and written
in whole lines (a failed write is cut back and named, not raised), the resume point per stream,
what a resumed run writes, a source resumed mid-file, and a stop that discards queued input."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from streamfuse.app import ResumePoint
from streamfuse.errors import SinkError, SourceError
from streamfuse.frames import AudioFrame, EndOfStream, VideoFrame
from streamfuse.pipeline.queues import FrameQueue
from streamfuse.sinks.jsonl import JsonlSink, read_jsonl
from streamfuse.sources.media import MediaSource, _next_in_thread

pytestmark = pytest.mark.unit

SHORT = Path(__file__).resolve().parents[2] / "assets" / "test" / "short.mp4"


def _asr(t0: float, t1: float, words: list[tuple[str, float, float]], id_: str) -> dict[str, Any]:
    return {
        "type": "asr",
        "stream_id": "s",
        "t_start": t0,
        "t_end": t1,
        "latency_ms": 1.0,
        "id": id_,
        "text": " ".join(w for w, _, _ in words),
        "words": [{"word": w, "t_start": a, "t_end": b, "p": 0.9} for w, a, b in words],
    }


def _ocr(t: float, id_: str) -> dict[str, Any]:
    return {"type": "ocr", "stream_id": "s", "t_start": t, "t_end": t, "id": id_, "text": "x"}


# -- the file ---------------------------------------------------------------------------------


def test_a_torn_last_line_is_counted_and_cut_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "ev.jsonl"
    whole = json.dumps(_ocr(0.0, "a" * 16)) + "\n"
    path.write_text(whole + '{"type": "asr", "stream_id": "s", "t_st')
    log = read_jsonl(path)
    assert [r["id"] for r in log.records] == ["a" * 16]
    assert log.torn_bytes > 0 and log.whole_bytes == len(whole.encode())
    log.cut_torn_tail()
    sink = JsonlSink(path, append=True)
    sink.write(_ocr(1.0, "b" * 16))
    sink.close()
    assert [r["id"] for r in read_jsonl(path).records] == ["a" * 16, "b" * 16]
    assert read_jsonl(path).torn_bytes == 0


def test_a_bad_line_inside_the_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "ev.jsonl"
    path.write_text(json.dumps(_ocr(0.0, "a" * 16)) + "\nnot json\n" + json.dumps(_ocr(1, "b")))
    with pytest.raises(SinkError, match=r"ev.jsonl:2"):
        read_jsonl(path)


def test_full_disk_and_unwritable_path_are_clear_errors_not_exceptions(tmp_path: Path) -> None:
    failures: list[SinkError] = []
    sink = JsonlSink("/dev/full")
    sink.on_failure = failures.append
    sink.write(_ocr(0.0, "a" * 16))
    sink.write(_ocr(1.0, "b" * 16))  # after a failure: nothing more is tried
    assert len(failures) == 1 and sink.failure is failures[0]
    assert "/dev/full" in str(sink.failure) and "No space left" in str(sink.failure)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SinkError, match=r"events to .*/file/ev.jsonl: .* not a folder"):
        JsonlSink(blocker / "ev.jsonl").open()


# A file size limit makes a write stop part-way, as a filling disk does: the sink must cut the
# partial line back and report, leaving only whole lines.
_SIZE_LIMIT = """
import resource, signal, sys
from streamfuse.sinks.jsonl import JsonlSink
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
sink = JsonlSink(sys.argv[1])
for i in range(100):
    sink.write({"type": "text", "stream_id": "s", "t_start": i, "text": "x" * 150})
sink.close()
print(sink.written, sink.failure)
"""


def test_a_write_cut_short_leaves_only_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "ev.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", _SIZE_LIMIT, str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    written, _, failure = proc.stdout.strip().partition(" ")
    assert 0 < int(written) < 100 and "cannot write events to" in failure
    data = path.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == int(written)
    assert read_jsonl(path).torn_bytes == 0


# -- the resume point -------------------------------------------------------------------------


def _log() -> list[dict[str, Any]]:
    return [
        _ocr(0.0, "o0"),
        _asr(0.5, 2.0, [("one", 0.5, 1.0), ("two", 1.2, 2.0)], "a0"),
        _ocr(20.0, "o1"),
        _asr(35.0, 38.0, [("three", 35.0, 38.0)], "a1"),
        _ocr(50.0, "o2"),
        _asr(45.0, 52.0, [("four", 45.0, 48.0), ("five", 50.0, 52.0)], "a2"),
        {"type": "stats", "stream_id": "*", "t_start": 0.0, "final": True, "interrupted": True},
    ]


def test_resume_point_per_stream() -> None:
    point = ResumePoint.from_records(_log(), replay_s=10.0)
    assert point.audio_cut_s == {"s": 52.0}
    # Replay from the last utterance end at least 10 s before the cut; video from the last
    # reading at or before that.
    assert point.audio_from_s == {"s": 38.0}
    assert point.video_from_s == {"s": 20.0}
    assert point.runs == 1 and not point.complete and point.streams == {"s"}
    assert ResumePoint.from_records(_log(), replay_s=60.0).audio_from_s == {"s": 0.0}
    finished = [*_log()[:-1], {**_log()[-1], "interrupted": False}]
    assert ResumePoint.from_records(finished).complete


def test_a_resumed_run_writes_only_what_is_new() -> None:
    point = ResumePoint.from_records(_log(), replay_s=10.0)
    assert point.admit(_ocr(50.0, "o2")) is None  # already in the file
    new = _ocr(55.0, "o3")
    assert point.admit(new) is new
    # Speech re-recognized before the cut: the file's version stands, whatever its id.
    assert point.admit(_asr(35.0, 38.1, [("three", 35.0, 38.1)], "zz")) is None
    # An utterance straddling the cut keeps its words after it, under an id of their own.
    rest = point.admit(_asr(45.0, 54.0, [("four", 45.0, 48.0), ("six", 52.5, 54.0)], "a2"))
    assert rest is not None and rest["text"] == "six" and rest["t_start"] == 52.5
    assert rest["id"] not in point.ids and len(rest["id"]) == 16
    after = _asr(53.0, 54.0, [("seven", 53.0, 54.0)], "a9")
    assert point.admit(after) is after


def test_other_inputs_than_the_file_holds_are_refused() -> None:
    with pytest.raises(Exception, match="same inputs"):
        ResumePoint.from_records(_log()).check_streams(["0:a", "1:b"])


# -- the source -------------------------------------------------------------------------------


async def _frames(source: MediaSource) -> list[Any]:
    await source.open()
    return [f async for f in source.frames()]


def test_a_resumed_source_keeps_times_and_indexes_of_the_first_run() -> None:
    full = asyncio.run(_frames(MediaSource(SHORT)))
    resumed_src = MediaSource(SHORT)
    asyncio.run(resumed_src.open())
    resumed_src.resume_from(video_s=4.6, audio_s=5.03, audio_align=8)
    resumed = asyncio.run(_frames(resumed_src))
    video = [f for f in full if isinstance(f, VideoFrame)]
    later = [f for f in resumed if isinstance(f, VideoFrame)]
    assert later[0].t_media == pytest.approx(4.6, abs=1e-3)
    assert [(f.index, f.t_media) for f in later] == [
        (f.index, f.t_media) for f in video if f.t_media >= 4.6 - 1e-3
    ]
    audio = [f for f in resumed if isinstance(f, AudioFrame)]
    # The first window: on the 8-window grid, at its sample-clock time.
    assert audio[0].index % 8 == 0 and audio[0].t_media >= 5.03 - 1e-3
    assert audio[0].t_media == pytest.approx(audio[0].index * 0.02, abs=1e-9)
    assert [f.index for f in audio] == list(range(audio[0].index, audio[0].index + len(audio)))


def test_a_live_input_cannot_be_resumed() -> None:
    source = MediaSource("rtsp://127.0.0.1:9/cam")
    source.live = True
    with pytest.raises(SourceError, match="cannot be resumed"):
        source.resume_from(audio_s=3.0)


def test_a_cancelled_read_leaves_the_generator_closable() -> None:
    entered = threading.Event()

    def slow() -> Generator[Any, None, None]:
        entered.set()
        time.sleep(0.3)
        yield None

    gen = slow()

    async def main() -> None:
        task = asyncio.create_task(_next_in_thread(gen))
        await asyncio.to_thread(entered.wait)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Cancelled, the read has returned: closing works (before, "generator already
        # executing" replaced the cancellation).
        assert not gen.gi_running
        gen.close()

    asyncio.run(main())


def test_discarding_queued_input_keeps_system_frames_and_wakes_the_producer() -> None:
    async def main() -> None:
        queue = FrameQueue(2)
        await queue.put(VideoFrame(image=_img()))
        await queue.put(EndOfStream())
        await queue.put(VideoFrame(image=_img()))
        blocked = asyncio.create_task(queue.put(VideoFrame(image=_img())))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        gone = await queue.discard_data()
        await asyncio.wait_for(blocked, 1.0)
        assert len(gone) == 2
        assert isinstance(await queue.get(), EndOfStream)
        assert isinstance(await queue.get(), VideoFrame) and queue.data_depth == 0

    asyncio.run(main())


def _img() -> Any:
    import numpy as np

    return np.zeros((2, 2, 3), np.uint8)
