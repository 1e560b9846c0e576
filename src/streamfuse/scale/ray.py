"""Stream branches on a Ray cluster: one host actor per node runs the streams placed there.

`RayStreams.run` (`run_on_ray`) places each input's branch (source -> OCR / ASR) on a node
of the cluster, pulls its events in batches into this process's sinks, and restarts a stream
whose node died on a live node. A restarted stream replays its input and the driver's `Ledger`
lets through only what lies past the stream's last committed media time (speech words by their
midpoint, slide text by its start, anything else by its key), so no committed event is lost or
repeated even where the replay segments the speech differently. Back-pressure crosses nodes:
a host holds at most `RayConfig.buffer` undelivered events per stream; past that its sink
waits, and the stream's pipeline waits behind it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from streamfuse.audio.policy import Word, join_words
from streamfuse.errors import ConfigError, StreamfuseError
from streamfuse.events import EventType, StageSnapshot, StatsPayload, stats_record
from streamfuse.frames import Frame
from streamfuse.sinks.base import EventSink

if TYPE_CHECKING:
    from streamfuse.app import Job, StreamfuseConfig
    from streamfuse.modelset import ModelSet

log = logging.getLogger(__name__)

#: Record fields that differ between two runs of the same input (when, not what).
_TIMING_FIELDS = frozenset({"latency_ms", "wall_s"})


class RayConfig(BaseModel):
    """How streams are placed on a Ray cluster (`streamfuse run --ray ADDRESS`)."""

    model_config = ConfigDict(extra="forbid")

    address: str = Field(
        "local",
        description="`local`: start a Ray instance in this process on this machine; `auto`: "
        "the cluster this machine joined with `ray start`; or the head's HOST:PORT.",
    )
    max_restarts: int = Field(
        3, ge=0, le=100, description="Times a stream is restarted on another node."
    )
    buffer: int = Field(
        256, ge=1, le=100_000, description="Undelivered events a node holds per stream."
    )
    batch: int = Field(64, ge=1, le=10_000, description="Events fetched per pull.")
    host_cpus: float = Field(
        1.0, ge=0.0, le=1024.0, description="CPUs a node's host actor reserves on its node."
    )
    share_models: bool = Field(
        True,
        description="Load the OCR and speech models once per node and share them among the "
        "node's streams (one call at a time each); False: every stream loads its own.",
    )


def event_key(record: dict[str, Any]) -> str:
    """What identifies an event across two runs of the same input: its `id` where the record
    has one, else its content without the timing fields."""
    if "id" in record:
        return str(record["id"])
    return json.dumps(
        {k: v for k, v in record.items() if k not in _TIMING_FIELDS},
        sort_keys=True,
        ensure_ascii=False,
    )


#: Delivered words a stream's ledger remembers for revisions (which touch the last utterance).
_WORDS_KEPT = 512


def _word_key(word: dict[str, Any]) -> tuple[str, float, float]:
    return (str(word["word"]), float(word["t_start"]), float(word["t_end"]))


class Ledger:
    """What one stream has delivered, and the filter a replay of it goes through.

    Committed events come in media-time order, so the last delivered one marks where a replay
    takes over: an `asr` event keeps the words whose midpoint lies past the last delivered
    word's end (a replay may cut the speech into other events, and shift word edges a little),
    an `ocr` event must start after the last one delivered, a partial must reach past the
    committed speech, an `asr_revision` is delivered only when every word it replaces was
    (a replay's revision corrects the replay's own words); any other record is delivered once
    by its key.
    """

    def __init__(self) -> None:
        self.asr_end = float("-inf")
        self.ocr_start = float("-inf")
        self.keys: set[str] = set()
        #: The latest delivered words (word, t_start, t_end): what a revision may replace.
        self.words: deque[tuple[str, float, float]] = deque(maxlen=_WORDS_KEPT)
        self.delivered = 0
        self.skipped = 0

    @property
    def committed_s(self) -> float:
        """Media time of the last committed event delivered (0 before any)."""
        return max(0.0, self.asr_end, self.ocr_start)

    def admit(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """`record` (trimmed to what is new), or None when it was delivered already."""
        kind = record["type"]
        out: dict[str, Any] | None = record
        if kind == EventType.ASR:
            words = [w for w in record["words"] if (w["t_start"] + w["t_end"]) / 2 > self.asr_end]
            if not words:
                out = None
            elif len(words) < len(record["words"]):
                out = {
                    **record,
                    "t_start": words[0]["t_start"],
                    "text": join_words(Word(w["word"], 0.0, 0.0) for w in words),
                    "words": words,
                }
            if out is not None:
                self.asr_end = words[-1]["t_end"]
                self.words.extend(_word_key(w) for w in words)
        elif kind == EventType.ASR_REVISION:
            delivered = set(self.words)
            if all(_word_key(w) in delivered for w in record["replaced"]):
                self.words.extend(_word_key(w) for w in record["words"])
            else:
                out = None
        elif kind == EventType.OCR:
            if record["t_start"] <= self.ocr_start:
                out = None
            else:
                self.ocr_start = record["t_start"]
        elif kind == EventType.ASR_PARTIAL and record["t_end"] <= self.asr_end and record["text"]:
            out = None
        elif event_key(record) in self.keys:
            out = None  # a partial, error or gap the first run delivered already
        if out is None:
            self.skipped += 1
            return None
        if "id" in out and out["id"] in self.keys:
            # Words past the cut in an event the replay started where a delivered one did.
            out = {**out, "id": f"{out['id']}+{round(out['t_start'] * 1000)}"}
        self.keys.add(event_key(out))
        self.delivered += 1
        return out


# -- the node side ------------------------------------------------------------------------------


class _QueueSink(EventSink):
    """A sink holding a bounded queue of records for the driver to pull."""

    def __init__(self, buffer: int) -> None:
        super().__init__("ray")
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(buffer)
        #: Records written outside the graph (build warnings): never block.
        self.extra: deque[dict[str, Any]] = deque()

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        record = self.render(frame)
        self.ids.assign(record)
        await self.queue.put(record)
        return
        yield  # pragma: no cover

    def write(self, record: dict[str, Any]) -> None:
        self.extra.append(record)

    def take(self, n: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while self.extra and len(out) < n:
            out.append(self.extra.popleft())
        while len(out) < n and not self.queue.empty():
            out.append(self.queue.get_nowait())
        return out


@dataclass
class _Hosted:
    job: Job
    sink: _QueueSink
    task: asyncio.Task[None]


class StreamHost:
    """The streams of one node, each its own pipeline in this actor's event loop (created with
    `ray.remote` by `run_on_ray`, pinned to its node).

    With `share_models` the node's streams share one `ModelSet`: the OCR and speech models
    are loaded once per node, not per stream, and serve the streams one call at a time, each
    with the threads one stream alone would get (not a per-stream share of the cores).
    """

    def __init__(self, share_models: bool = True) -> None:
        logging.getLogger("faster_whisper").setLevel(logging.ERROR)
        logging.getLogger("RapidOCR").setLevel(logging.ERROR)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self._streams: dict[str, _Hosted] = {}
        self._share = share_models
        self._models: ModelSet | None = None

    def _model_set(self, config: StreamfuseConfig) -> ModelSet | None:
        from streamfuse.app import share_cores
        from streamfuse.modelset import ModelSet

        if self._share and self._models is None:
            vision, asr = share_cores(config, 1)
            self._models = ModelSet(
                ocr_threads=vision.ocr.intra_op_threads, asr_threads=asr.cpu_threads
            )
        return self._models

    def where(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    async def start(
        self,
        stream_id: str,
        location: str,
        config_json: str,
        n_streams: int,
        buffer: int,
        key: str | None = None,
    ) -> dict[str, Any]:
        """Open `location` and start its branch as stream `stream_id`, held under `key`
        (default: the stream id; several drivers sharing a host give each run its own);
        returns its duration (None: live)."""
        from streamfuse.app import StreamfuseConfig, build_pipeline, media_source, run_job

        key = key or stream_id
        await self.stop(key)
        config = StreamfuseConfig.model_validate_json(config_json)
        source = media_source(location, stream_id, config)
        sink = _QueueSink(buffer)
        job = await build_pipeline(
            [source], config, [sink], n_streams=n_streams, models=self._model_set(config)
        )
        task = asyncio.create_task(run_job(job, [sink]), name=f"stream:{key}")
        self._streams[key] = _Hosted(job, sink, task)
        return {"duration_s": source.duration_s}

    async def pull(
        self, key: str, max_n: int, wait_s: float
    ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Up to `max_n` records of the stream held under `key` (waiting up to `wait_s` for
        the first), and its final `stats` record once it has ended and every record was
        pulled."""
        hosted = self._streams[key]
        sink = hosted.sink
        if not sink.extra and sink.queue.empty() and not hosted.task.done():
            getter = asyncio.ensure_future(sink.queue.get())
            done, _ = await asyncio.wait({getter, hosted.task}, timeout=wait_s)
            if getter in done:
                sink.extra.appendleft(getter.result())
            else:
                getter.cancel()
        records = sink.take(max_n)
        if hosted.task.done() and not sink.extra and sink.queue.empty():
            del self._streams[key]
            hosted.task.result()  # a failure of the run reaches the driver
            return records, hosted.job.summary()
        return records, None

    async def stop(self, key: str) -> None:
        """Stop the stream held under `key` now (nothing to do if it ended)."""
        hosted = self._streams.pop(key, None)
        if hosted is not None and not hosted.task.done():
            hosted.job.pipeline.request_stop()
            hosted.task.cancel()
            await asyncio.gather(hosted.task, return_exceptions=True)

    def memory(self) -> dict[str, Any]:
        """This node's host process: resident and peak resident memory (MiB), and the models
        its shared set loaded (empty without sharing)."""
        import resource

        import psutil

        # ru_maxrss is in KiB on Linux.
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {
            "rss_mib": round(psutil.Process().memory_info().rss / 2**20, 1),
            "peak_rss_mib": round(peak_mib, 1),
            "models_loaded": dict(self._models.loads) if self._models else {},
        }


# -- the driver side ----------------------------------------------------------------------------


@dataclass
class StreamRun:
    """What happened to one stream: where it ran, restarts, replayed events skipped."""

    stream_id: str
    location: str
    #: What its node's host holds it under (the stream id, or a caller's unique key).
    key: str = ""
    nodes: list[str] = field(default_factory=list)
    restarts: int = 0
    events: int = 0
    skipped: int = 0
    #: Media time of the last committed event delivered (where a restart had to reach).
    committed_s: float = 0.0
    duration_s: float | None = None
    error: str | None = None
    final: dict[str, Any] | None = None


@dataclass
class RayReport:
    streams: list[StreamRun]
    nodes: int
    wall_s: float
    summary: dict[str, Any]
    #: Per live node at the end: its host's memory and model loads (`StreamHost.memory`).
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)


class _Cluster:
    """The driver's view: one host actor per live node, streams placed least-loaded first."""

    def __init__(self, config: RayConfig) -> None:
        self.config = config
        self.hosts: dict[str, Any] = {}
        self.load: dict[str, int] = {}
        self.dead: set[str] = set()

    def connect(self) -> int:
        import ray

        if not ray.is_initialized():
            address = None if self.config.address == "local" else self.config.address
            kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
            if address is None:
                kwargs["include_dashboard"] = False
            try:
                ray.init(address=address, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ConfigError(f"cannot reach the Ray cluster at {address!r}: {e}") from e
        return len(self.alive_nodes())

    def alive_nodes(self) -> list[str]:
        import ray

        return [
            n["NodeID"]
            for n in ray.nodes()
            if n.get("Alive") and n["NodeID"] not in self.dead and n["Resources"].get("CPU", 0)
        ]

    def host(self, node_id: str) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = self.hosts.get(node_id)
        if actor is None:
            remote = ray.remote(StreamHost).options(
                num_cpus=self.config.host_cpus,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            actor = self.hosts[node_id] = remote.remote(self.config.share_models)
            self.load.setdefault(node_id, 0)
        return actor

    def place(self) -> str:
        nodes = self.alive_nodes()
        if not nodes:
            raise StreamfuseError("no live Ray node left to run the stream on")
        node = min(nodes, key=lambda n: (self.load.get(n, 0), n))
        self.load[node] = self.load.get(node, 0) + 1
        return node

    def release(self, node_id: str) -> None:
        self.load[node_id] = max(0, self.load.get(node_id, 0) - 1)

    def lost(self, node_id: str) -> None:
        self.dead.add(node_id)
        self.hosts.pop(node_id, None)
        self.load.pop(node_id, None)


class RayStreams:
    """The driver: places stream branches on a Ray cluster's nodes and pulls their events.

    One instance can serve many `run` calls at once (`streamfuse serve` gives each URL
    session its own call): they share one host actor per node (so a node's models load once
    for all of them) and its placement counts.
    """

    def __init__(self, config: RayConfig | None = None) -> None:
        self.config = config or RayConfig()
        self._cluster = _Cluster(self.config)
        self._nodes: int | None = None

    async def connect(self) -> int:
        """Join (or start) the cluster; returns its live nodes."""
        if self._nodes is None:
            self._nodes = await asyncio.to_thread(self._cluster.connect)
        return self._nodes

    async def run(
        self,
        inputs: Sequence[str],
        config: StreamfuseConfig,
        sinks: Sequence[EventSink],
        *,
        keys: Sequence[str] | None = None,
        on_start: Callable[[StreamRun], None] | None = None,
    ) -> RayReport:
        """Run every input's branch on the cluster; its events go to `sinks` (their `write`),
        then one merged final `stats` record. `keys` (one per input, unique among concurrent
        runs) name the branches on their hosts; `on_start` is called with a stream's run once
        its input is open on a node (the first time only).

        Raises `SourceError` for an input no node could open (as a local run does) and
        `ConfigError` for an unreachable cluster or a config Ray cannot run (the language
        model spans streams and stays local: not supported here yet). Cancelled, it stops
        its streams on their nodes.
        """
        import ray.exceptions as rex

        from streamfuse.app import stream_id_of

        ray_config, cluster = self.config, self._cluster
        if config.lm is not None:
            raise ConfigError("--ask runs the language model over all streams: not with --ray yet")
        n_nodes = await self.connect()
        started = time.monotonic()
        config_json = config.model_dump_json()
        per_node = max(1, -(-len(inputs) // max(1, n_nodes)))
        runs = [StreamRun(stream_id_of(x, i, len(inputs)), x) for i, x in enumerate(inputs)]
        for run, key in zip(runs, keys or [r.stream_id for r in runs], strict=True):
            run.key = key
        lost_node = (rex.ActorDiedError, rex.ActorUnavailableError, rex.RayActorError)

        async def drive(run: StreamRun) -> None:
            ledger = Ledger()
            announced = on_start is None
            while True:
                node = await asyncio.to_thread(cluster.place)
                host = cluster.host(node)
                run.nodes.append(node)
                try:
                    meta = await host.start.remote(
                        run.stream_id,
                        run.location,
                        config_json,
                        per_node,
                        ray_config.buffer,
                        run.key,
                    )
                    run.duration_s = meta["duration_s"]
                    if not announced:
                        assert on_start is not None
                        on_start(run)
                        announced = True
                    while True:
                        records, final = await host.pull.remote(run.key, ray_config.batch, 0.5)
                        for record in records:
                            admitted = ledger.admit(record)
                            if admitted is not None:
                                for sink in sinks:
                                    sink.write(admitted)
                        run.events, run.skipped = ledger.delivered, ledger.skipped
                        run.committed_s = ledger.committed_s
                        if final is not None:
                            run.final = final
                            cluster.release(node)
                            return
                except asyncio.CancelledError:
                    cluster.release(node)
                    host.stop.remote(run.key)  # not awaited: the caller is going away
                    raise
                except lost_node as e:
                    cluster.lost(node)
                    if run.restarts >= ray_config.max_restarts:
                        run.error = f"node lost {run.restarts + 1} times, gave up: {e}"
                        return
                    run.restarts += 1
                    log.warning(
                        "stream %s: node %s lost at media time %.1f s; restarting elsewhere",
                        run.stream_id,
                        node[:8],
                        run.committed_s,
                    )
                except rex.RayTaskError as e:
                    cluster.release(node)
                    cause = e.cause if isinstance(e.cause, BaseException) else e
                    if isinstance(cause, StreamfuseError):
                        raise cause from None
                    raise StreamfuseError(f"{run.location}: failed on node {node[:8]}: {e}") from e

        await asyncio.gather(*(drive(run) for run in runs))
        summary = merged_summary(runs, config.realtime, time.monotonic() - started)
        for sink in sinks:
            sink.emit(summary)
        hosts: dict[str, dict[str, Any]] = {}
        for node, actor in list(cluster.hosts.items()):
            try:
                hosts[node] = await actor.memory.remote()
            except lost_node:
                continue  # died after its streams ended: nothing to report
        return RayReport(runs, n_nodes, time.monotonic() - started, summary, hosts)


async def run_on_ray(
    inputs: Sequence[str],
    config: StreamfuseConfig,
    sinks: Sequence[EventSink],
    ray_config: RayConfig | None = None,
) -> RayReport:
    """Run every input's branch on the cluster, its events into `sinks` (`RayStreams.run`)."""
    return await RayStreams(ray_config).run(inputs, config, sinks)


def merged_summary(runs: Sequence[StreamRun], realtime: bool, wall_s: float) -> dict[str, Any]:
    """One final `stats` record over every stream's (CPU time summed over the nodes)."""
    stages: dict[str, StageSnapshot] = {}
    cpu_s = 0.0
    media = [r.duration_s for r in runs if r.duration_s]
    for run in runs:
        if run.final is None:
            continue
        cpu_s += float(run.final.get("cpu_s", 0.0))
        for name, snap in run.final.get("stages", {}).items():
            stages[name] = StageSnapshot.model_validate(snap)
    payload = StatsPayload(final=True, realtime=realtime, cpu_s=round(cpu_s, 3), stages=stages)
    return stats_record(payload, t_end=max(media) if media else 0.0, wall_s=wall_s)


__all__ = [
    "Ledger",
    "RayConfig",
    "RayReport",
    "RayStreams",
    "StreamHost",
    "StreamRun",
    "event_key",
    "merged_summary",
    "run_on_ray",
]
