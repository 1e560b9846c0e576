"""The main job: media inputs -> (change detection -> OCR) + (VAD -> streaming ASR) -> sinks.

`StreamfuseConfig` is the one validated configuration passed down to every subsystem;
`build_pipeline` wires one branch per input stream into a single `Pipeline` whose sinks receive
every stream's events. Library users compose their own graphs with `Pipeline.link` instead.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict, Field

from streamfuse import telemetry
from streamfuse.audio import AsrConfig, AsrStage, ScreenTerms
from streamfuse.errors import SourceError
from streamfuse.events import EventRecord, StatsPayload
from streamfuse.frames import ErrorFrame, now_wall
from streamfuse.fusion import TimelineConfig, TimelineStage
from streamfuse.lm.stage import LMStage, LMStageConfig
from streamfuse.pipeline import OverloadPolicy, Pipeline, Stage
from streamfuse.pipeline.source import Source
from streamfuse.pipeline.tracing import TracingObserver
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
    cpu_start_s: float = field(default_factory=lambda: _cpu_s())
    wall_start_s: float = field(default_factory=now_wall)

    def summary(self) -> dict[str, Any]:
        """The final `stats` record of the run."""
        return self.stats_record(final=True)

    def stats_record(self, *, final: bool) -> dict[str, Any]:
        """A `stats` record of the run so far (`final`: the run's last record)."""
        media = [s.duration_s for s in self.sources if s.duration_s]
        payload = StatsPayload(
            final=final,
            realtime=any(s.pacer.realtime for s in self.sources if isinstance(s, MediaSource)),
            cpu_s=round(_cpu_s() - self.cpu_start_s, 3),
            stages=self.pipeline.snapshot(),
        )
        record = EventRecord(
            type=payload.type,
            stream_id="*",
            t_start=0.0,
            t_end=round(max(media), 3) if media else 0.0,
            latency_ms=0.0,
            wall_s=round(self._streaming_s(), 3),
            payload=payload,
        )
        return record.to_json_dict()

    def _streaming_s(self) -> float:
        p = self.pipeline
        if p.started_wall is not None:
            return (p.finished_wall or now_wall()) - p.started_wall
        return now_wall() - self.wall_start_s


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
) -> Job:
    """Open every input (raising `SourceError` with a clear message) and wire the graph.

    An input is a file path or URL, or a ready `Source`: a `MediaSource` (e.g. bytes pushed
    in, `streamfuse.sources.pipe`) or a `TextSource`, whose `text` events go to the sinks and
    the timeline. `ocr_pool`: OCR workers shared with other jobs (kept open when this one
    ends); `n_streams`: streams sharing the cores (default: this job's inputs).
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
    own_pools: list[ThreadPoolExecutor] = []
    if ocr_pool is None and config.ocr and len(media_inputs) > 1:
        # Several streams' OCR reads share one pool, a worker per core's worth of OCR
        # threads: reads are served first come, first served instead of time-slicing cores.
        ocr_pool = ocr_executor(vision_config)
        own_pools.append(ocr_pool)
    # One timeline and one language-model stage for all streams: each keeps its state per
    # stream, and the LM batches every stream's answers through one KV-cache pool.
    lm = LMStage(lm_config(config, n_streams)) if config.lm is not None else None
    timeline = TimelineStage(config.timeline) if lm is not None else None
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
            stream_id = Path(location).stem if len(inputs) == 1 else f"{i}:{Path(location).stem}"
            source = MediaSource(
                location,
                stream_id=stream_id,
                realtime=config.realtime,
                audio=config.asr,
                video=config.ocr,
                config=config.source,
            )
        await source.open()
        if not (source.has_video or source.has_audio):
            raise SourceError(f"{location}: nothing to do (no usable audio or video stream)")
        sources.append(source)
        branch_ends: list[Stage] = []
        if config.ocr and source.has_video:
            change = ChangeDetector(vision_config, name=f"change:{stream_id}")
            vision_policy = make_policy(
                vision_config.policy, realtime=config.realtime, signals=signals
            )
            ocr = OcrStage(vision_config, policy=vision_policy, name=f"ocr:{stream_id}")
            if ocr_pool is not None:
                ocr.share_executor(ocr_pool)
            ocr_stages[stream_id] = ocr
            if signals is not None:
                signals.watch_drops(ocr)
            policies[stream_id] = ocr.policy
            # Live, OCR only ever needs the newest settled picture, so it never builds a
            # backlog; offline (as fast as possible) nothing is skipped.
            policy = OverloadPolicy.LATEST_ONLY if config.realtime else OverloadPolicy.BLOCK
            if getattr(source, "selects_key_frames", False):
                # Its frames are key frames already (an edge ran the change detector:
                # `streamfuse.transport.cloud`), so they go straight to OCR.
                pipeline.link(source, ocr, policy=policy)
            else:
                pipeline.link(source, change, maxsize=config.video_queue)
                pipeline.link(change, ocr, policy=policy)
            branch_ends.append(ocr)
        elif config.ocr:
            warnings.append(_note(stream_id, location, "no video stream: OCR skipped"))
        if config.asr and source.has_audio:
            screen = None
            if stream_id in ocr_stages and asr_config.prime_max_terms > 0:
                # Slide-aware ASR: the stream's `ocr` events reach its ASR stage by observation.
                screen = ScreenTerms(stream_id, window_s=asr_config.prime_window_s)
                pipeline.observe(screen)
            asr = AsrStage(
                asr_config,
                screen_terms=screen,
                live=config.realtime or source.live,
                name=f"asr:{stream_id}",
            )
            pipeline.link(source, asr, maxsize=config.audio_queue)
            branch_ends.append(asr)
        elif config.asr:
            warnings.append(
                _note(stream_id, location, "no audio stream: speech recognition skipped")
            )
        for end in branch_ends:
            for sink in sinks:
                pipeline.link(end, sink, maxsize=256)
            if timeline is not None:
                pipeline.link(end, timeline, maxsize=256)
        if not branch_ends:
            raise SourceError(f"{location}: nothing to do with the selected paths")
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
    )


def ocr_executor(vision: VisionConfig) -> ThreadPoolExecutor:
    """A pool for several streams' OCR reads: one worker per core's worth of OCR threads."""
    cores = os.cpu_count() or 1
    return ThreadPoolExecutor(
        max_workers=max(1, cores // vision.ocr.intra_op_threads), thread_name_prefix="sf-ocr"
    )


def _note(stream_id: str, location: str, message: str) -> ErrorFrame:
    return ErrorFrame(stream_id=stream_id, stage="input", message=f"{location}: {message}")


async def run_job(job: Job, sinks: list[EventSink]) -> None:
    """Run the job; warnings raised while building are written to the sinks first."""
    for warning in job.warnings:
        for sink in sinks:
            sink.write(warning.to_record())
    job.wall_start_s = now_wall()
    job.cpu_start_s = _cpu_s()
    try:
        await job.pipeline.run()
    finally:
        for executor in job.executors:
            executor.shutdown(wait=False, cancel_futures=True)
