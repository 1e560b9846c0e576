"""The main job: media inputs -> (change detection -> OCR) + (VAD -> streaming ASR) -> sinks.

`StreamfuseConfig` is the one validated configuration passed down to every subsystem;
`build_pipeline` wires one branch per input stream into a single `Pipeline` whose sinks receive
every stream's events. Library users compose their own graphs with `Pipeline.link` instead.
`ResumePoint` reads where an interrupted run's events stop, so a new job continues it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict, Field

from streamfuse import telemetry
from streamfuse.audio import AsrConfig, AsrStage, BackgroundReader, ScreenTerms
from streamfuse.audio.vad import CHUNK as VAD_CHUNK
from streamfuse.errors import ConfigError, SourceError
from streamfuse.events import EventIds, EventType, StatsPayload, stats_record
from streamfuse.frames import ErrorFrame, now_wall
from streamfuse.fusion import TimelineConfig, TimelineStage
from streamfuse.lm.stage import LMStage, LMStageConfig
from streamfuse.model_pool import StageModels
from streamfuse.pipeline import OverloadPolicy, Pipeline, Stage
from streamfuse.pipeline.source import Source
from streamfuse.pipeline.tracing import TracingObserver
from streamfuse.qos.allocation import AllocationConfig, CoreBudget, LoadMonitor, governor
from streamfuse.qos.signals import QosSignals
from streamfuse.sinks.base import EventSink
from streamfuse.sources import SourceConfig
from streamfuse.sources.media import MediaSource
from streamfuse.sources.text import TextSource
from streamfuse.telemetry import TelemetryConfig
from streamfuse.vision import ChangeDetector, OcrStage, ResolutionPolicy, VisionConfig
from streamfuse.vision.adaptive import make_policy
from streamfuse.vision.config import FixedPolicy


class StreamfuseConfig(BaseModel):
    """Top-level configuration of the main job."""

    model_config = ConfigDict(extra="forbid")

    realtime: bool = Field(False, description="Pace inputs at wall-clock speed, as a live feed.")
    ocr: bool = Field(True, description="Run the vision path (change detection + OCR).")
    asr: bool = Field(True, description="Run the audio path (VAD + streaming ASR).")
    video_queue: int = Field(64, ge=1, le=10_000, description="Video frames buffered before OCR.")
    audio_queue: int = Field(
        3000, ge=50, le=100_000, description="20 ms audio windows buffered before ASR (60 s)."
    )
    audio_shed_after_s: float = Field(
        10.0,
        ge=0.0,
        le=600.0,
        description="Live input: when speech recognition falls this many seconds behind the "
        "audio's arrival, the queued audio older than half of it is skipped (counted as drops "
        "on the edge into ASR), so the speech that is transcribed keeps a bounded latency on "
        "an overloaded machine. 0: never skip (all speech is transcribed, however late).",
    )
    vision: VisionConfig = Field(
        default_factory=VisionConfig,
        description="Change detection, OCR and the resolution policy (`vision.policy`).",
    )
    asr_config: AsrConfig = Field(default_factory=AsrConfig)
    lm: LMStageConfig | None = Field(
        None,
        description="Live notes / answers from the language model over every stream's fused "
        "timeline (None: no language model). `lm.ask` is the standing question, asked at each "
        "timeline checkpoint.",
    )
    timeline: TimelineConfig = Field(
        default_factory=TimelineConfig,
        description="How OCR and speech events become the language model's context (with `lm`).",
    )
    source: SourceConfig = Field(
        default_factory=SourceConfig,
        description="How inputs are opened and kept alive: FFmpeg input options, stall "
        "timeout, reconnection with backoff, interleaving buffer (`docs/inputs.md`).",
    )
    telemetry: TelemetryConfig = Field(
        default_factory=TelemetryConfig,
        description="OpenTelemetry traces, metrics and logs and their exporters (off unless an "
        "exporter is asked for; `build_pipeline` installs them, `telemetry.shutdown` flushes).",
    )
    allocation: AllocationConfig = Field(
        default_factory=AllocationConfig,
        description="How the streams' OCR and ASR model threads share the cores: a fixed "
        "split, or leased per call following measured stage load (`streamfuse.qos.allocation`).",
    )


@dataclass
class Job:
    """A built pipeline with its sources and the notes raised while building it."""

    pipeline: Pipeline
    sources: list[Source]
    warnings: list[ErrorFrame] = field(default_factory=list)
    #: Per stream id: its OCR stage and that stage's resolution policy.
    ocr_stages: dict[str, OcrStage] = field(default_factory=dict)
    policies: dict[str, ResolutionPolicy] = field(default_factory=dict)
    #: Signals shared by the adaptive policies (None with the fixed policy).
    signals: QosSignals | None = None
    #: Worker pools shared by several stages (shut down when the job ends).
    executors: list[ThreadPoolExecutor] = field(default_factory=list)
    #: The load monitor and core budget of load-driven allocation (None: the fixed split).
    allocation: LoadMonitor | None = None
    #: cpufreq governor to set while the job runs (`AllocationConfig.governor`).
    governor: str | None = None
    cpu_start_s: float = field(default_factory=lambda: _cpu_s())
    wall_start_s: float = field(default_factory=now_wall)

    def summary(self, *, interrupted: bool = False) -> dict[str, Any]:
        """The final `stats` record of the run (`interrupted`: stopped before the end)."""
        return self.stats_record(final=True, interrupted=interrupted)

    def stats_record(self, *, final: bool, interrupted: bool = False) -> dict[str, Any]:
        """A `stats` record of the run so far (`final`: the run's last record)."""
        media = [s.duration_s for s in self.sources if s.duration_s]
        payload = StatsPayload(
            final=final,
            realtime=any(s.pacer.realtime for s in self.sources if isinstance(s, MediaSource)),
            cpu_s=round(_cpu_s() - self.cpu_start_s, 3),
            stages=self.pipeline.snapshot(),
            interrupted=interrupted,
        )
        return stats_record(payload, t_end=max(media) if media else 0.0, wall_s=self._streaming_s())

    def _streaming_s(self) -> float:
        p = self.pipeline
        if p.started_wall is not None:
            return (p.finished_wall or now_wall()) - p.started_wall
        return now_wall() - self.wall_start_s


#: Types whose records a resumed run re-produces while its speech recognizer warms up.
_SPEECH_TYPES = frozenset({EventType.ASR, EventType.ASR_PARTIAL, EventType.ASR_REVISION})


@dataclass
class ResumePoint:
    """Where the events of an interrupted run stop, per stream, read from its records.

    A stream's committed speech ends with its last `asr` event (`audio_cut_s`); the speech
    after it was never committed and is recognized again. The recognizer's state there
    (audio context, text prompt, VAD state) depends on the speech before, so its audio is
    replayed from an utterance end about `replay_s` earlier (`audio_from_s`; from the start
    for a cut within the first `replay_s`), and speech records starting before the cut are
    not written again (`admit`). The video continues from the last `ocr` reading at or
    before the replay start (the OCR stage and the slide priming of speech start from the
    picture then on screen). Records re-produced with an id already in the file are not
    written twice.
    """

    #: Every id already in the file.
    ids: set[str] = field(default_factory=set)
    #: Per stream id: the end of its committed speech, and where its audio / video resume.
    audio_cut_s: dict[str, float] = field(default_factory=dict)
    audio_from_s: dict[str, float] = field(default_factory=dict)
    video_from_s: dict[str, float] = field(default_factory=dict)
    #: Streams with any record in the file.
    streams: set[str] = field(default_factory=set)
    #: Runs already in the file (their final `stats` records): the next run's number.
    runs: int = 0
    #: The file ends with a finished run (a final, uninterrupted `stats` record).
    complete: bool = False

    @classmethod
    def from_records(
        cls, records: Sequence[dict[str, Any]], *, replay_s: float = 30.0
    ) -> ResumePoint:
        point = cls()
        speech: dict[str, list[tuple[float, float]]] = {}
        ocr_times: dict[str, list[float]] = {}
        for record in records:
            kind, stream = record.get("type"), str(record.get("stream_id", ""))
            if isinstance(record.get("id"), str):
                point.ids.add(record["id"])
            if kind == EventType.STATS:
                if record.get("final"):
                    point.runs += 1
                    point.complete = not record.get("interrupted", False)
                continue
            point.complete = False
            point.streams.add(stream)
            if kind == EventType.ASR:
                span = (float(record["t_start"]), float(record["t_end"]))
                speech.setdefault(stream, []).append(span)
            elif kind == EventType.OCR:
                ocr_times.setdefault(stream, []).append(float(record["t_start"]))
        for stream, spans in speech.items():
            cut = max(end for _, end in spans)
            point.audio_cut_s[stream] = cut
            # An utterance end well before the cut (no speech running across it), else 0.
            ends = [
                end
                for start, end in spans
                if end <= cut - replay_s and not any(s < end < e for s, e in spans)
            ]
            point.audio_from_s[stream] = max(ends, default=0.0)
        for stream, times in ocr_times.items():
            start = point.audio_from_s.get(stream)
            before = [t for t in times if start is None or t <= start]
            point.video_from_s[stream] = max(before) if before else min(times)
        return point

    def admit(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """What of `record` (of the resumed run) is still to be written: None if its id is
        in the file or it is speech before its stream's committed speech ends (re-recognized
        while the recognizer warmed up: the file's version stands). Speech that straddles the
        end keeps its words after it, as a record of their own (the interrupted run committed
        the rest, cut where the input stopped)."""
        cut = self.audio_cut_s.get(str(record.get("stream_id")))
        if (
            cut is None
            or record.get("type") not in _SPEECH_TYPES
            or float(record["t_start"]) >= cut - 0.0005
        ):
            return None if record.get("id") in self.ids else record
        words = [w for w in record.get("words", ()) if float(w["t_start"]) >= cut - 0.0005]
        if record["type"] != EventType.ASR or not words:
            return None
        rest = {k: v for k, v in record.items() if k != "id"}
        rest.update(
            t_start=words[0]["t_start"],
            text=" ".join(str(w["word"]).strip() for w in words),
            words=words,
        )
        EventIds().assign(rest)
        return rest

    def check_streams(self, stream_ids: Sequence[str]) -> None:
        """Raise `ConfigError` if the file holds streams this job does not have."""
        unknown = sorted(self.streams - set(stream_ids) - {"*"})
        if unknown:
            raise ConfigError(
                f"the events file holds stream(s) {', '.join(unknown)} that this run does not "
                f"have ({', '.join(stream_ids)}): resume with the same inputs, in the same order"
            )


def _cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


def core_share(n_streams: int) -> int:
    """Cores each of `n_streams` streams may use for its model threads (at least one)."""
    return max(1, (os.cpu_count() or 1) // max(1, n_streams))


def share_cores(config: StreamfuseConfig, n_streams: int) -> tuple[VisionConfig, AsrConfig]:
    """Cap each stream's model threads at its share of the cores (and resolve the OCR
    precision `auto` for the job's stream count: `OcrConfig.resolve_precision`).

    Every stream has its own OCR and ASR sessions; with more streams than cores, per-session
    thread pools larger than the share only oversubscribe the CPU (threads preempt each other
    mid-kernel) and raise every stream's latency.
    """
    share = core_share(n_streams)
    ocr = config.vision.ocr
    update: dict[str, object] = {
        "intra_op_threads": min(ocr.intra_op_threads, share),
        "precision": ocr.resolve_precision(n_streams),
    }
    vision = config.vision.model_copy(update={"ocr": ocr.model_copy(update=update)})
    asr = config.asr_config.model_copy(
        update={"cpu_threads": min(config.asr_config.cpu_threads, share)}
    )
    return vision, asr


def lm_config(config: StreamfuseConfig, n_streams: int) -> LMStageConfig:
    """The LM stage's settings with its torch threads capped at one stream's share of the
    cores, as `share_cores` caps the OCR and ASR threads (the LM serves every stream, but runs
    beside their models)."""
    assert config.lm is not None
    engine = config.lm.lm
    threads = min(engine.model.threads, core_share(n_streams))
    model = engine.model.model_copy(update={"threads": threads})
    return config.lm.model_copy(update={"lm": engine.model_copy(update={"model": model})})


async def build_pipeline(
    inputs: Sequence[str | Source],
    config: StreamfuseConfig,
    sinks: list[EventSink],
    *,
    ocr_pool: ThreadPoolExecutor | None = None,
    n_streams: int | None = None,
    resume: ResumePoint | None = None,
    models: StageModels | None = None,
) -> Job:
    """Open every input (raising `SourceError` with a clear message) and wire the graph.

    An input is a file path or URL, or a ready `Source`: a `MediaSource` (e.g. bytes pushed
    in, `streamfuse.sources.pipe`) or a `TextSource`, whose `text` events go to the sinks and
    the timeline. `ocr_pool`: OCR workers shared with other jobs (kept open when this one
    ends); `n_streams`: streams sharing the cores (default: this job's inputs). `resume`:
    continue an interrupted run (each media input starts where its events stop; the sinks
    are told which ids exist, see `ResumePoint`). `models`: where the OCR and Whisper models
    come from (e.g. a `ModelPool` kept across jobs); `config.allocation.mode == "load"` makes
    them lease their threads from a core budget fed by a `LoadMonitor`.
    """
    pipeline = Pipeline("streamfuse")
    # Installs the SDK when the config asks for an exporter (idempotent); an application that
    # called `telemetry.setup` itself gets its traces too.
    active = telemetry.setup(config.telemetry) or telemetry.current()
    if active is not None and active.tracer is not None:
        pipeline.observe(
            TracingObserver(
                active.tracer,
                sample_ratio=active.sample_ratio,
                trace_events=active.config.trace_events,
            )
        )
    sources: list[Source] = []
    warnings: list[ErrorFrame] = []
    ocr_stages: dict[str, OcrStage] = {}
    policies: dict[str, ResolutionPolicy] = {}
    signals: QosSignals | None = None
    if config.ocr and not isinstance(config.vision.policy, FixedPolicy):
        # ASR latency and lost key frames reach the vision policies by observing the pipeline.
        signals = QosSignals()
        pipeline.observe(signals)
    media_inputs = [item for item in inputs if not isinstance(item, TextSource)]
    n_streams = n_streams or max(1, len(media_inputs))
    vision_config, asr_config = share_cores(config, n_streams)
    monitor: LoadMonitor | None = None
    if config.allocation.mode == "load":
        # Threads follow measured load: each model call leases them from one budget.
        monitor = LoadMonitor(CoreBudget(config.allocation.cores), config.allocation)
        pipeline.observe(monitor)
        pool = models.pool if models is not None else None
        models = StageModels(
            budget=monitor.budget,
            ocr_max_threads=config.allocation.ocr_max_threads,
            asr_max_threads=config.allocation.asr_max_threads,
            # No call gets fewer threads than the fixed split would give it.
            ocr_min_threads=vision_config.ocr.intra_op_threads,
            asr_min_threads=asr_config.cpu_threads,
            pool=pool,
        )
        # The shared OCR pool gets a worker per core: the budget bounds the threads.
        single = vision_config.ocr.model_copy(update={"intra_op_threads": 1})
        vision_config = vision_config.model_copy(update={"ocr": single})
    own_pools: list[ThreadPoolExecutor] = []
    if ocr_pool is None and config.ocr and len(media_inputs) > 1:
        # Several streams' OCR reads share one pool, a worker per core's worth of OCR
        # threads: reads are served first come, first served instead of time-slicing cores.
        ocr_pool = ocr_executor(vision_config)
        own_pools.append(ocr_pool)
    # One timeline and one language-model stage for all streams: each keeps its state per
    # stream, and the LM batches every stream's answers through one KV-cache pool.
    lm = None
    if config.lm is not None:
        lm_settings = lm_config(config, n_streams)
        lm = models.lm_stage(lm_settings) if models is not None else LMStage(lm_settings)
    timeline = TimelineStage(config.timeline) if lm is not None else None
    reader: BackgroundReader | None = None  # the ASR stages' background reviser, shared
    for i, item in enumerate(inputs):
        if isinstance(item, TextSource):
            sources.append(item)
            for sink in sinks:
                pipeline.link(item, sink, maxsize=256)
            if timeline is not None:
                pipeline.link(item, timeline, maxsize=256)
            continue
        if isinstance(item, MediaSource):
            source, location = item, item.location
            stream_id = source.stream_id
        else:
            location = str(item)
            source = media_source(location, stream_id_of(location, i, len(inputs)), config)
            stream_id = source.stream_id
        await source.open()
        if not (source.has_video or source.has_audio):
            raise SourceError(f"{location}: nothing to do (no usable audio or video stream)")
        if resume is not None and stream_id in resume.streams:
            source.resume_from(
                video_s=resume.video_from_s.get(stream_id),
                audio_s=resume.audio_from_s.get(stream_id),
                # The VAD reads 512-sample blocks: resumed on the first run's block grid, it
                # sees the same blocks, so speech starts and ends (and word times) agree.
                audio_align=math.lcm(VAD_CHUNK, source.window_samples) // source.window_samples,
            )
        sources.append(source)
        branch_ends: list[Stage] = []
        if config.ocr and source.has_video:
            change = ChangeDetector(vision_config, name=f"change:{stream_id}")
            vision_policy = make_policy(
                vision_config.policy, realtime=config.realtime, signals=signals
            )
            ocr_name = f"ocr:{stream_id}"
            engine = None
            if models is not None:
                engine = models.ocr_engine(
                    vision_config.ocr, stage=ocr_name, streams=n_streams, slot=i
                )
            ocr = OcrStage(vision_config, policy=vision_policy, engine=engine, name=ocr_name)
            if ocr_pool is not None:
                ocr.share_executor(ocr_pool)
            ocr_stages[stream_id] = ocr
            if signals is not None:
                signals.watch_drops(ocr)
            policies[stream_id] = ocr.policy
            # Live, OCR only ever needs the newest settled picture, so it never builds a
            # backlog; offline (as fast as possible) nothing is skipped.
            policy = OverloadPolicy.LATEST_ONLY if config.realtime else OverloadPolicy.BLOCK
            if source.selects_key_frames:
                # Its frames are key frames already (an edge ran the change detector:
                # `streamfuse.transport.cloud`), so they go straight to OCR.
                pipeline.link(source, ocr, policy=policy)
            else:
                pipeline.link(source, change, maxsize=config.video_queue)
                pipeline.link(change, ocr, policy=policy)
            branch_ends.append(ocr)
        elif config.ocr:
            warnings.append(_note(stream_id, location, NO_VIDEO_NOTE))
        if config.asr and source.has_audio:
            screen = None
            if stream_id in ocr_stages and asr_config.prime_max_terms > 0:
                # Slide-aware ASR: the stream's `ocr` events reach its ASR stage by observation.
                screen = ScreenTerms(stream_id, window_s=asr_config.prime_window_s)
                pipeline.observe(screen)
            asr_name = f"asr:{stream_id}"
            if asr_config.revises_in_background and reader is None:
                reader = BackgroundReader(asr_config)  # one accurate model for every stream
            asr = AsrStage(
                asr_config,
                transcriber=(
                    models.transcriber(asr_config, stage=asr_name, slot=i)
                    if models is not None
                    else None
                ),
                screen_terms=screen,
                reader=reader,
                live=config.realtime or source.live,
                name=asr_name,
            )
            if (config.realtime or source.live) and config.audio_shed_after_s > 0:
                # Live speech transcribed a minute late is of no use: past the bound, skip.
                pipeline.link(
                    source,
                    asr,
                    maxsize=config.audio_queue,
                    policy=OverloadPolicy.SHED_LATE,
                    max_age_s=config.audio_shed_after_s,
                )
            else:
                pipeline.link(source, asr, maxsize=config.audio_queue)
            branch_ends.append(asr)
        elif config.asr:
            warnings.append(_note(stream_id, location, NO_AUDIO_NOTE))
        for end in branch_ends:
            for sink in sinks:
                pipeline.link(end, sink, maxsize=256)
            if timeline is not None:
                pipeline.link(end, timeline, maxsize=256)
        if not branch_ends:
            raise SourceError(f"{location}: nothing to do with the selected paths")
    if resume is not None:
        resume.check_streams([s.stream_id for s in sources])
    if lm is not None and timeline is not None and timeline in pipeline.stages:
        pipeline.link(timeline, lm, maxsize=256)
        for sink in sinks:
            pipeline.link(lm, sink, maxsize=1024)
    return Job(
        pipeline=pipeline,
        sources=sources,
        warnings=warnings,
        ocr_stages=ocr_stages,
        policies=policies,
        signals=signals,
        executors=own_pools,
        allocation=monitor,
        governor=config.allocation.governor,
    )


def stream_id_of(location: str, index: int, n_inputs: int) -> str:
    """The stream id of input `index` of `n_inputs`: its file name without the extension,
    numbered when there are several (`0:lecture`, `1:lecture`)."""
    stem = Path(location).stem
    return stem if n_inputs == 1 else f"{index}:{stem}"


def media_source(location: str, stream_id: str, config: StreamfuseConfig) -> MediaSource:
    """The (unopened) source of a file or URL input, paced and filtered as `config` says."""
    return MediaSource(
        location,
        stream_id=stream_id,
        realtime=config.realtime,
        audio=config.asr,
        video=config.ocr,
        config=config.source,
    )


def ocr_executor(vision: VisionConfig) -> ThreadPoolExecutor:
    """A pool for several streams' OCR reads: one worker per core's worth of OCR threads."""
    cores = os.cpu_count() or 1
    return ThreadPoolExecutor(
        max_workers=max(1, cores // vision.ocr.intra_op_threads), thread_name_prefix="sf-ocr"
    )


#: The notices of an input without the stream a selected path needs (`error` events).
NO_VIDEO_NOTE = "no usable video stream: OCR skipped"
NO_AUDIO_NOTE = "no audio stream: speech recognition skipped"


def _note(stream_id: str, location: str, message: str) -> ErrorFrame:
    return ErrorFrame(stream_id=stream_id, stage="input", message=f"{location}: {message}")


async def run_job(job: Job, sinks: list[EventSink]) -> None:
    """Run the job; warnings raised while building are written to the sinks first."""
    for warning in job.warnings:
        for sink in sinks:
            sink.emit(warning.to_record())
    job.wall_start_s = now_wall()
    job.cpu_start_s = _cpu_s()
    try:
        with governor(job.governor):
            await job.pipeline.run()
    finally:
        for executor in job.executors:
            executor.shutdown(wait=False, cancel_futures=True)
