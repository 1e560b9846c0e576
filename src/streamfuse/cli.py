"""The command line: `run` a stream through the pipeline, `demo` the bundled clip, `eval` a run.

Bad input ends with a one-line `error: ...` on stderr and exit status 2 (nothing started) or 1
(the input broke part-way, or the events file could not be written: the events produced so far
are kept). SIGINT/SIGTERM stop reading input, write the events in flight and the final `stats`
record, and exit 128 + the signal (a second signal stops at once); `run --resume` continues.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from streamfuse.errors import SinkError, StreamfuseError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="streamfuse: live OCR + speech timeline from media streams, within a latency budget.",
)
err = Console(stderr=True)


class VisionPolicyChoice(StrEnum):
    """`vision.policy.kind` (`streamfuse.vision.config.PolicyKind`)."""

    fixed = "fixed"
    dynamic = "dynamic"
    article = "article"


class OcrPrecisionChoice(StrEnum):
    auto = "auto"
    int8 = "int8"
    fp32 = "fp32"


class ThreadsChoice(StrEnum):
    fixed = "fixed"
    load = "load"


out = Console()

# Gemma 3 270M is a base model, not a chat model: answers are rough. Of the prompts tried on the
# demo clip this one gave the most useful notes.
DEMO_NOTES_PROMPT = "What did the speaker just say, in a few words?"


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("RapidOCR", "faster_whisper", "onnxruntime"):
        logging.getLogger(noisy).setLevel(logging.INFO if verbose else logging.ERROR)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


@dataclass
class _Stop:
    """Signals received during a run: the first stops reading input and lets what was read
    drain to the sinks; a second one stops at once."""

    signals: list[int] = field(default_factory=list)
    job: Any = None
    main: asyncio.Task[Any] | None = None
    task: asyncio.Task[None] | None = None
    stopping: asyncio.Task[int] | None = None
    sink_failure: StreamfuseError | None = None

    def on_signal(self, signum: int) -> None:
        self.signals.append(signum)
        if len(self.signals) == 1:
            err.print(
                f"{signal.Signals(signum).name}: stopping, writing the events in flight "
                "(again to stop at once)",
                highlight=False,
                soft_wrap=True,
            )
            if self.job is not None:
                self.stopping = asyncio.get_running_loop().create_task(
                    self.job.pipeline.stop_reading()
                )
        elif self.task is not None:
            self.task.cancel()
        elif self.main is not None:
            self.main.cancel()  # still building (loading models): nothing to write yet

    def on_sink_failure(self, failure: StreamfuseError) -> None:
        # Nothing more can be kept: stop reading (what stages hold drains, unwritten).
        self.sink_failure = failure
        if self.job is not None and self.stopping is None:
            self.stopping = asyncio.get_running_loop().create_task(self.job.pipeline.stop_reading())


async def _run(
    inputs: list[str],
    config: Any,
    out_path: Path | None,
    live: bool,
    *,
    resume: Any = None,
    stop: _Stop | None = None,
    models: Any = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the job; `resume`: the `ResumePoint` of `out_path`, continued (appended to);
    `models`: the `StageModels` the stages take their models from (a harness running many
    inputs in one process passes a `ModelSet` loaded once)."""
    from streamfuse import telemetry
    from streamfuse.app import build_pipeline, run_job
    from streamfuse.events import EventIds
    from streamfuse.sinks import CollectSink, JsonlSink
    from streamfuse.sinks.console import ConsoleView

    point = resume
    stop = stop or _Stop()
    stop.main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.on_signal, signum)
    try:
        collect = CollectSink()
        sinks: list[Any] = [collect]
        jsonl = None
        if out_path:
            jsonl = JsonlSink(
                out_path, append=point is not None, admit=point.admit if point else None
            )
            jsonl.on_failure = stop.on_sink_failure
            jsonl.open()  # an unwritable path fails now, before models load
            sinks.append(jsonl)
        if point is not None:
            for sink in sinks:
                sink.ids = EventIds(run=point.runs)
        job = await build_pipeline(inputs, config, sinks, resume=point, models=models)
        stop.job = job
        view = ConsoleView({s.stream_id: s.duration_s for s in job.sources})
        job.pipeline.observe(view)
        for warning in job.warnings:
            view.show(warning)
        if stop.signals:  # stopped while the models were loading: nothing to run
            await job.pipeline.stop_reading()
        task = asyncio.create_task(run_job(job, sinks))
        stop.task = task
        try:
            if live:
                with Live(view.render(job.pipeline), console=out, refresh_per_second=4) as screen:
                    while not task.done():
                        await asyncio.wait({task}, timeout=0.25)
                        screen.update(view.render(job.pipeline))
            await task
        except asyncio.CancelledError:
            if not stop.signals:
                raise
        finally:
            if stop.stopping is not None:
                await stop.stopping
            summary = job.summary(interrupted=bool(stop.signals))
            if jsonl:
                jsonl.emit(summary)
                jsonl.close()
            telemetry.shutdown()  # flush every exporter (nothing when telemetry is off)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    if jsonl is not None and jsonl.failure is not None:
        raise jsonl.failure
    if not live:
        out.print(view.render(job.pipeline))
    return collect.records, summary


def _need_ray() -> None:
    """`--ray` given: Ray must be installed."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise _fail("--ray needs Ray: pip install 'streamfuse[scale]'") from None


async def _run_ray(
    inputs: list[str], config: Any, out_path: Path | None, address: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`run --ray`: the streams on a Ray cluster, their events into this process's sinks."""
    from streamfuse.scale import RayConfig, run_on_ray
    from streamfuse.sinks import CollectSink, JsonlSink

    collect = CollectSink()
    jsonl = JsonlSink(out_path) if out_path else None
    sinks: list[Any] = [collect] + ([jsonl] if jsonl else [])
    try:
        report = await run_on_ray(inputs, config, sinks, RayConfig(address=address))
    finally:
        if jsonl:
            jsonl.close()
    table = Table(title=f"Ray: {report.nodes} node(s), {report.wall_s:.1f} s")
    for column in ("stream", "nodes", "restarts", "events", "replayed", "media s", "problem"):
        table.add_column(column)
    for run in report.streams:
        table.add_row(
            run.stream_id,
            " -> ".join(n[:8] for n in run.nodes),
            str(run.restarts),
            str(run.events),
            str(run.skipped),
            f"{run.committed_s:.1f}",
            run.error or "",
        )
    out.print(table)
    return collect.records, report.summary


# The telemetry options of every command that runs a pipeline (`_telemetry_options` reads them).
OtlpOption = Annotated[
    bool | None,
    typer.Option(
        "--otlp/--no-otlp",
        help="Export traces, metrics and logs over OTLP, configured by the standard "
        "OTEL_EXPORTER_OTLP_* variables (default: on when an OTLP endpoint is set there).",
    ),
]
PrometheusPortOption = Annotated[
    int | None,
    typer.Option(help="Serve metrics for Prometheus at http://127.0.0.1:PORT/metrics."),
]
TraceRatioOption = Annotated[
    float | None,
    typer.Option(
        help="Share of frames traced through every stage (default 0.05, or "
        "OTEL_TRACES_SAMPLER_ARG); frames behind an event are always traced."
    ),
]


@app.command()
def run(
    inputs: Annotated[list[str], typer.Argument(help="Media files or URLs (several run at once).")],
    realtime: Annotated[bool, typer.Option(help="Pace input at wall-clock speed (live).")] = False,
    out_path: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write events as JSON Lines here.")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="Continue an interrupted run of the same inputs and options: read this events "
            "file, start each input where its committed events stop, append (no event twice).",
        ),
    ] = None,
    asr_model: Annotated[
        str, typer.Option(help="tiny.en, base, or a path to a CTranslate2 Whisper model.")
    ] = "tiny.en",
    ocr: Annotated[bool, typer.Option("--ocr/--no-ocr", help="Run slide OCR.")] = True,
    asr: Annotated[bool, typer.Option("--asr/--no-asr", help="Run speech recognition.")] = True,
    live: Annotated[
        bool | None,
        typer.Option("--live/--no-live", help="Live terminal view (default: on a TTY)."),
    ] = None,
    vision_policy: Annotated[
        VisionPolicyChoice | None,
        typer.Option(
            "--vision-policy",
            help="OCR resolution policy (vision.policy.kind): fixed, dynamic (default: "
            "latency-budget feedback, changed-region ROI) or article (F15 rule).",
        ),
    ] = None,
    ocr_budget_s: Annotated[
        float | None,
        typer.Option(
            "--ocr-budget-s",
            help="OCR latency budget in seconds of the dynamic policy "
            "(vision.policy.controller.budget_s, default 1.0).",
        ),
    ] = None,
    ocr_precision: Annotated[
        OcrPrecisionChoice | None,
        typer.Option(
            "--ocr-precision",
            help="OCR detector precision: int8 (~1.6x less CPU per read), fp32 (rapidocr's own "
            "model) or auto (default: int8 with several inputs, fp32 with one).",
        ),
    ] = None,
    ask: Annotated[
        str | None,
        typer.Option(
            "--ask",
            help="A question the language model answers over each stream's live timeline (on "
            "every new slide, every 30 s and at the end), streamed as lm_token / lm events.",
        ),
    ] = None,
    threads: Annotated[
        ThreadsChoice | None,
        typer.Option(
            "--threads",
            help="How the streams' OCR and ASR model threads share the cores: fixed (default: "
            "cores // streams each, set once) or load (leased per call, following each "
            "stage's measured busy time; allocation.mode).",
        ),
    ] = None,
    otlp: OtlpOption = None,
    prometheus_port: PrometheusPortOption = None,
    trace_ratio: TraceRatioOption = None,
    input_option: Annotated[
        list[str] | None,
        typer.Option(
            "--input-option",
            help="FFmpeg option for opening the inputs, key=value (repeatable), e.g. "
            "rtsp_transport=tcp, buffer_size=4194304; format=alsa picks the demuxer or device.",
        ),
    ] = None,
    reconnect_attempts: Annotated[
        int | None,
        typer.Option(
            help="Reconnection attempts when a URL or device drops or stalls, with doubling "
            "backoff (source.reconnect_attempts, default 5; 0: fail at once)."
        ),
    ] = None,
    stall_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--stall-timeout-s",
            help="Seconds without data after which a URL or device counts as dropped "
            "(source.stall_timeout_s, default 5).",
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A JSON job config (StreamfuseConfig, e.g. `streamfuse pareto --slo`'s "
            "chosen.json); the options above given on the command line override it.",
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="Run each input's branch on a Ray cluster: `local` (start one here), `auto` "
            "(the cluster this machine joined with `ray start`) or the head's HOST:PORT. A "
            "stream whose node dies restarts on another node (needs `pip install "
            "streamfuse[scale]`).",
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run media inputs through the pipeline and print / write the live timeline."""
    _setup_logging(verbose)
    base: dict[str, Any] | None = None
    if config_file is not None:
        try:
            base = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise _fail(f"--config {config_file}: {e}") from None
        if not isinstance(base, dict):
            raise _fail(f"--config {config_file}: expected a JSON object")
    code = _run_main(
        inputs,
        realtime,
        out_path,
        asr_model,
        ocr,
        asr,
        live,
        vision_policy=vision_policy.value if vision_policy else None,
        ocr_budget_s=ocr_budget_s,
        ocr_precision=ocr_precision.value if ocr_precision else None,
        ask=ask,
        threads=threads.value if threads else None,
        telemetry=_telemetry_options(otlp, prometheus_port, trace_ratio),
        source=_source_options(input_option, reconnect_attempts, stall_timeout_s),
        base=base,
        ray_address=ray_address,
        resume=resume,
    )
    raise typer.Exit(code)


def _source_options(
    input_options: list[str] | None, reconnect_attempts: int | None, stall_timeout_s: float | None
) -> dict[str, Any]:
    """The `source` part of the job config (`streamfuse.sources.SourceConfig`)."""
    source: dict[str, Any] = {}
    if input_options:
        pairs = {}
        for item in input_options:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise _fail(f"--input-option expects key=value, got {item!r}")
            pairs[key.strip()] = value
        source["input_options"] = pairs
    if reconnect_attempts is not None:
        source["reconnect_attempts"] = reconnect_attempts
    if stall_timeout_s is not None:
        source["stall_timeout_s"] = stall_timeout_s
    return source


def _telemetry_options(
    otlp: bool | None, prometheus_port: int | None, trace_ratio: float | None
) -> dict[str, Any]:
    """The `telemetry` part of the job config (`streamfuse.telemetry.TelemetryConfig`)."""
    from streamfuse.telemetry import TelemetryConfig

    options: dict[str, Any] = {"otlp": TelemetryConfig.endpoint_in_env() if otlp is None else otlp}
    if prometheus_port is not None:
        options["prometheus_port"] = prometheus_port
    if trace_ratio is not None:
        options["sample_ratio"] = trace_ratio
    return options


def _vision_options(
    vision_policy: str | None, ocr_budget_s: float | None, ocr_precision: str | None
) -> dict[str, Any]:
    """The `vision` part of the job config for the vision options given (empty: defaults).

    `--vision-policy` is `vision.policy.kind`; `--ocr-budget-s` is the dynamic policy's
    `vision.policy.controller.budget_s` (no other policy has a budget).
    """
    from streamfuse.vision.config import VisionConfig

    kind = vision_policy or VisionConfig().policy.kind
    if ocr_budget_s is not None and kind != "dynamic":
        raise _fail(f"--ocr-budget-s applies to --vision-policy dynamic, not {kind}")
    vision: dict[str, Any] = {}
    if vision_policy is not None or ocr_budget_s is not None:
        policy: dict[str, Any] = {"kind": kind}
        if ocr_budget_s is not None:
            policy["controller"] = {"budget_s": ocr_budget_s}
        vision["policy"] = policy
    if ocr_precision is not None:
        vision["ocr"] = {"precision": ocr_precision}
    return vision


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on top, nested objects merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _resume_point(path: Path) -> Any:
    """The `ResumePoint` of an events file (its torn last line, if any, cut off)."""
    from streamfuse.app import ResumePoint
    from streamfuse.sinks.jsonl import read_jsonl

    if not path.is_file():
        raise _fail(f"nothing to resume: events file not found: {path}")
    try:
        log = read_jsonl(path)
        log.cut_torn_tail()
    except SinkError as e:
        raise _fail(str(e)) from None
    return ResumePoint.from_records(log.records)


def _run_main(
    inputs: list[str],
    realtime: bool,
    out_path: Path | None,
    asr_model: str,
    ocr: bool,
    asr: bool,
    live: bool | None,
    *,
    vision_policy: str | None = None,
    ocr_budget_s: float | None = None,
    ocr_precision: str | None = None,
    ask: str | None = None,
    threads: str | None = None,
    telemetry: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
    base: dict[str, Any] | None = None,
    ray_address: str | None = None,
    resume: Path | None = None,
) -> int:
    from pydantic import ValidationError

    from streamfuse.app import StreamfuseConfig
    from streamfuse.events import ErrorPayload, EventType, parse_record

    if not (ocr or asr):
        raise _fail("both --no-ocr and --no-asr: nothing to do")
    try:
        extra: dict[str, Any] = {}
        vision = _vision_options(vision_policy, ocr_budget_s, ocr_precision)
        if vision:
            extra["vision"] = vision
        if ask is not None:
            extra["lm"] = {"ask": ask}
        if threads is not None:
            extra["allocation"] = {"mode": threads}
        if telemetry:
            extra["telemetry"] = telemetry
        if source:
            extra["source"] = source
        if base is None:
            config = StreamfuseConfig(
                realtime=realtime, ocr=ocr, asr=asr, asr_config={"model": asr_model}, **extra
            )
        else:
            # A flag left at its default keeps the file's value (typer cannot tell the two).
            cli: dict[str, Any] = {**extra}
            if realtime:
                cli["realtime"] = True
            if not ocr or not asr:
                cli.update(ocr=ocr, asr=asr)
            if asr_model != "tiny.en":
                cli["asr_config"] = {"model": asr_model}
            config = StreamfuseConfig.model_validate(_merged(base, cli))
    except ValidationError as e:
        raise _fail(f"invalid option: {e.errors()[0]['msg']}") from None
    show_live = out.is_terminal if live is None else live
    point = None
    if resume is not None:
        if out_path is not None and out_path.resolve() != resume.resolve():
            raise _fail(f"--resume appends to {resume}; --out {out_path} names another file")
        out_path = resume
        point = _resume_point(resume)
        if point.complete:
            err.print(
                f"{resume} holds a finished run: nothing to resume", highlight=False, soft_wrap=True
            )
            return 0
    stop = _Stop()
    try:
        if ray_address is not None:
            if resume is not None:
                raise _fail("--resume is not supported with --ray")
            _need_ray()
            records, _ = asyncio.run(_run_ray(inputs, config, out_path, ray_address))
        else:
            records, _ = asyncio.run(
                _run(inputs, config, out_path, show_live, resume=point, stop=stop)
            )
    except SinkError as e:
        raise _fail(str(e), code=1 if stop.job is not None else 2) from None
    except StreamfuseError as e:
        raise _fail(str(e)) from None
    except asyncio.CancelledError:
        records = []  # a second signal while the models were loading
    if stop.signals:
        signum = stop.signals[0]
        where = f": events written to {out_path}; continue with --resume {out_path}"
        err.print(
            f"interrupted ({signal.Signals(signum).name}){where if out_path else ''}",
            highlight=False,
            soft_wrap=True,
        )
        return 128 + signum
    # Only the error records need parsing (a run has hundreds of others).
    parsed = (parse_record(r).payload for r in records if r["type"] == EventType.ERROR)
    errors = [p for p in parsed if isinstance(p, ErrorPayload)]
    for problem in errors:
        if problem.stage == "input":
            err.print(f"[yellow]note:[/yellow] {problem.message}", highlight=False, soft_wrap=True)
    broken = [p for p in errors if p.stage.startswith("media:")]
    if broken:
        message = f"{broken[0].message} (partial results kept)"
        err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
        return 1
    if out_path:
        err.print(f"events written to {out_path}", highlight=False, soft_wrap=True)
    return 0


@app.command()
def demo(
    realtime: Annotated[bool, typer.Option(help="Play the clip at live speed.")] = True,
    out_path: Annotated[Path, typer.Option("--out", "-o")] = Path("out/demo.events.jsonl"),
    asr_model: Annotated[str, typer.Option(help="tiny.en, base, or a model path.")] = "tiny.en",
    live: Annotated[bool | None, typer.Option("--live/--no-live")] = None,
    notes: Annotated[
        bool,
        typer.Option(
            "--notes/--no-notes",
            help="Live notes from the language model (Gemma 3 270M) on each new slide.",
        ),
    ] = False,
    otlp: OtlpOption = None,
    prometheus_port: PrometheusPortOption = None,
    trace_ratio: TraceRatioOption = None,
) -> None:
    """Run the bundled lecture clip live, then score it against its ground truth."""
    from streamfuse.assets import demo_files

    _setup_logging(False)
    with demo_files() as files:
        if not files.clip.is_file():
            raise _fail(f"bundled demo clip not found at {files.clip}")
        code = _run_main(
            [str(files.clip)],
            realtime,
            out_path,
            asr_model,
            True,
            True,
            live,
            ask=DEMO_NOTES_PROMPT if notes else None,
            telemetry=_telemetry_options(otlp, prometheus_port, trace_ratio),
        )
        if code == 0:
            _print_scores(_score(files.truth, out_path))
    raise typer.Exit(code)


def _score(truth_path: Path, events_path: Path) -> dict[str, Any]:
    from streamfuse.evaluation import evaluate, load_events, load_truth

    try:
        return evaluate(load_truth(truth_path), load_events(events_path))
    except StreamfuseError as e:
        raise _fail(str(e)) from None


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else str(v)


def _print_scores(result: dict[str, Any]) -> None:
    table = Table(title="scores", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("OCR CER", _fmt(result.get("ocr_cer"), pct=True))
    table.add_row("ASR WER", _fmt(result.get("asr_wer"), pct=True))
    for kind, q in result.get("latency_ms", {}).items():
        table.add_row(
            f"{kind} latency p50 / p95", f"{q['p50']:.0f} / {q['p95']:.0f} ms (n={q['n']})"
        )
    if "asr_word_latency_ms" in result:
        q = result["asr_word_latency_ms"]
        table.add_row("asr word end -> commit p50 / p95", f"{q['p50']:.0f} / {q['p95']:.0f} ms")
    if "ocr_change_latency_ms" in result:
        q = result["ocr_change_latency_ms"]
        table.add_row("slide change -> ocr p50 / p95", f"{q['p50']:.0f} / {q['p95']:.0f} ms")
    if "end_lag_s" in result:
        table.add_row("last event after stream end", f"{result['end_lag_s']:.2f} s")
    table.add_row("RTF (wall / media)", _fmt(result.get("rtf")))
    out.print(table)


@app.command("eval")
def eval_cmd(
    events: Annotated[
        Path,
        typer.Argument(
            help="Events JSON Lines from `streamfuse run --out`; or a folder of media files, "
            "each with NAME.truth.json beside it: run and score the whole set."
        ),
    ],
    truth: Annotated[
        Path | None, typer.Option("--truth", help="Ground truth JSON (for an events file).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    realtime: Annotated[
        bool, typer.Option(help="A set's items run at live speed (as deployed).")
    ] = True,
    asr_model: Annotated[str, typer.Option(help="A set's ASR model.")] = "tiny.en",
    split: Annotated[
        list[str] | None, typer.Option(help="Only the set's items of this split (repeatable).")
    ] = None,
    events_dir: Annotated[
        Path | None, typer.Option("--events-dir", help="Keep each set item's events here.")
    ] = None,
) -> None:
    """Score a run against ground truth: OCR CER, ASR WER, latency per event type, RTF; or run
    and score a whole evaluation set (per-item rows, pooled figures per split)."""
    _setup_logging(False)
    if events.is_dir():
        _eval_set(events, realtime, asr_model, split, events_dir, as_json)
        return
    if truth is None:
        raise _fail(f"{events}: scoring an events file needs --truth TRUTH.json")
    result = _score(truth, events)
    if as_json:
        slim = {k: v for k, v in result.items() if k not in ("ocr_slides", "asr_hyp")}
        typer.echo(json.dumps(slim))
    else:
        _print_scores(result)


def _cut_truth(truth: Any, end_s: float) -> tuple[Any, float]:
    """The truth of a clip's first `end_s` seconds, cut after the last utterance that ends by
    then (so no word is half in); returns it and the cut time."""
    from streamfuse.evaluation import Truth

    said = [u for u in truth.asr if u.t_end <= end_s]
    cut_s = min(truth.duration_s, (said[-1].t_end + 0.3) if said else end_s)
    slides = [
        s.model_copy(update={"t_end": min(s.t_end, cut_s)}) for s in truth.ocr if s.t_start < cut_s
    ]
    return Truth(duration_s=cut_s, ocr=slides, asr=said), cut_s


async def _measure_point(
    doc: dict[str, Any], clip: Path, truth: Any, streams: int, meter: Any, models: Any = None
) -> dict[str, float | None]:
    """Run `clip` as `streams` inputs under the job config `doc`; score every stream against
    `truth` and keep the worst latency and the mean error rates. `models`: a `StageModels`
    whose pool keeps the OCR and Whisper models loaded from one point to the next."""
    from streamfuse.app import StreamfuseConfig, build_pipeline, run_job
    from streamfuse.evaluation import evaluate
    from streamfuse.sinks import CollectSink

    config = StreamfuseConfig.model_validate(doc)
    sink = CollectSink()
    job = await build_pipeline([str(clip)] * streams, config, [sink], models=models)
    meter.start()
    await run_job(job, [sink])
    reading = meter.stop()
    cpu_s, wall_s = reading.cpu_s, reading.seconds
    ids = sorted({r["stream_id"] for r in sink.records if r["type"] in ("ocr", "asr")})
    results = [evaluate(truth, [r for r in sink.records if r["stream_id"] == i]) for i in ids]

    def worst(kind: str, q: str) -> float | None:
        v = [r["latency_ms"][kind][q] / 1000.0 for r in results if kind in r["latency_ms"]]
        return round(max(v), 3) if v else None

    def mean(key: str) -> float | None:
        v = [r[key] for r in results if r.get(key) is not None]
        return round(sum(v) / len(v), 4) if len(v) == streams else None

    m: dict[str, float | None] = {
        "ocr_p50": worst("ocr", "p50"),
        "ocr_p95": worst("ocr", "p95"),
        "asr_p50": worst("asr", "p50"),
        "asr_p95": worst("asr", "p95"),
        "cer": mean("ocr_cer"),
        "wer": mean("asr_wer"),
        "cpu_s": round(cpu_s, 2),
        "wall_s": round(wall_s, 2),
        "energy_j": round(reading.joules, 1),
    }
    p95 = [v for v in (m["ocr_p95"], m["asr_p95"]) if v is not None]
    m["latency_p95_s"] = max(p95) if len(p95) == 2 else None
    return m


@app.command()
def pareto(
    clip: Annotated[
        Path | None, typer.Argument(help="Clip to sweep on (default: the bundled lecture).")
    ] = None,
    truth: Annotated[Path | None, typer.Option(help="Its ground truth (with CLIP).")] = None,
    quick: Annotated[
        bool, typer.Option(help="30 configurations on the first 5 s of the clip.")
    ] = False,
    n_configs: Annotated[
        int | None, typer.Option("--configs", min=2, help="Configurations (default 30 / 60).")
    ] = None,
    clip_s: Annotated[
        float | None, typer.Option(help="Seconds of the clip each run plays (default 5 / 12).")
    ] = None,
    realtime: Annotated[
        bool, typer.Option(help="Play at live speed (latency as a live feed sees it).")
    ] = True,
    slo: Annotated[
        str | None,
        typer.Option(help="Pick the operating point, e.g. 'ocr_p95<=1.0,wer<=0.10' (s, fraction)."),
    ] = None,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Table, plot, points and the chosen config go here.")
    ] = Path("out/pareto"),
    seed: Annotated[int, typer.Option(help="Which configurations the sample draws.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line.")] = False,
) -> None:
    """Sweep configurations (vision policy and budget, OCR precision, ASR model / beam /
    update interval, LM on/off, streams), measure latency, CER, WER, CPU and energy, and
    print the Pareto frontier; with --slo, write the chosen point as a `run --config` file."""
    import tempfile

    from rich.progress import Progress

    from streamfuse.assets import demo_files
    from streamfuse.evaluation import load_truth
    from streamfuse.model_pool import ModelPool, StageModels
    from streamfuse.qos.energy import EnergyMeter
    from streamfuse.qos.pareto import (
        Point,
        SweepSpace,
        choose,
        frontier,
        parse_slo,
        plot,
        table,
        write_config,
    )
    from streamfuse.testing.media import cut

    _setup_logging(False)
    for noisy in ("RapidOCR", "onnxruntime", "streamfuse", "faster_whisper"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        rules = parse_slo(slo) if slo else None
    except StreamfuseError as e:
        raise _fail(str(e)) from None
    if (clip is None) != (truth is None):
        raise _fail("give both CLIP and --truth, or neither (the bundled lecture)")
    n = n_configs or (30 if quick else 60)
    configs = SweepSpace().sample(n, seed=seed)
    meter = EnergyMeter()
    energy = (
        f"estimate: CPU-seconds x {meter.watts_per_core:g} W per busy core"
        if meter.source == "model"
        else f"measured ({meter.source}, whole package)"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    points: list[Point] = []
    # Models stay loaded from one point to the next (loading is not what a point measures).
    models = StageModels(pool=ModelPool())
    with demo_files() as files, tempfile.TemporaryDirectory() as tmp:
        src, truth_path = (clip, truth) if clip is not None else (files.clip, files.truth)
        assert src is not None and truth_path is not None
        short, cut_s = _cut_truth(load_truth(truth_path), clip_s or (5.0 if quick else 12.0))
        piece = cut(src, Path(tmp) / f"clip{src.suffix}", cut_s)
        with Progress(console=err, transient=as_json) as progress:
            task = progress.add_task("sweep", total=len(configs))
            for c in configs:
                progress.update(task, description=c.name)
                doc = c.job_config(realtime=realtime)
                try:
                    metrics = asyncio.run(
                        _measure_point(doc, piece, short, c.streams, meter, models)
                    )
                except StreamfuseError as e:
                    err.print(f"[yellow]{c.name}: {e}[/yellow]", highlight=False)
                    metrics = {}
                points.append(Point(c.name, doc, c.streams, metrics))
                progress.advance(task)
    chosen = choose(points, rules) if rules else None
    front = frontier(points)
    (out_dir / "points.json").write_text(
        json.dumps([{"name": p.name, "streams": p.streams, **p.metrics} for p in points], indent=1)
    )
    (out_dir / "table.md").write_text(f"Energy: {energy}.\n\n" + table(points, chosen))
    plot(points, out_dir / "pareto.png", energy_label=energy, chosen=chosen)
    if not as_json:
        out.print(table(points, chosen), highlight=False, soft_wrap=True)
        out.print(f"energy: {energy}; {len(front)} of {len(points)} on the frontier")
    if rules and chosen is None:
        err.print(f"[red]no configuration meets {slo}[/red]", highlight=False)
    elif chosen is not None:
        write_config(chosen, out_dir / "chosen.json")
        err.print(
            f"chosen: {chosen.name} -> {out_dir / 'chosen.json'} (run it with "
            f"`streamfuse run --config {out_dir / 'chosen.json'}` and {chosen.streams} input(s))",
            highlight=False,
            soft_wrap=True,
        )
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "configs": len(points),
                    "frontier": [p.name for p in front],
                    "chosen": None if chosen is None else {"name": chosen.name, **chosen.metrics},
                    "energy": energy,
                    "clip_s": cut_s,
                }
            )
        )
    raise typer.Exit(1 if rules and chosen is None else 0)


def _eval_set(
    root: Path,
    realtime: bool,
    asr_model: str,
    splits: list[str] | None,
    events_dir: Path | None,
    as_json: bool,
) -> None:
    from streamfuse.app import StreamfuseConfig
    from streamfuse.evalset import EvalItem, evaluate_set, find_items

    try:
        items = find_items(root)
    except StreamfuseError as e:
        raise _fail(str(e)) from None
    if splits:
        items = [i for i in items if i.split in splits]
        if not items:
            raise _fail(f"{root}: no items of split {', '.join(splits)}")
    config = StreamfuseConfig(realtime=realtime, asr_config={"model": asr_model})

    def progress(item: EvalItem, row: dict[str, Any]) -> None:
        err.print(
            f"{item.split}/{item.name}: CER {_fmt(row['ocr_cer'], pct=True)} "
            f"WER {_fmt(row['asr_wer'], pct=True)}",
            highlight=False,
        )

    result = asyncio.run(evaluate_set(items, config, events_dir=events_dir, progress=progress))
    if as_json:
        typer.echo(json.dumps({"items": result.rows, "splits": result.splits}))
        return
    rows = Table(title=f"{root}: {len(items)} items", title_justify="left")
    for column in ("split", "item", "OCR CER", "ASR WER", "word p95 ms", "RTF", "errors"):
        rows.add_column(column)
    for row in result.rows:
        rows.add_row(
            row["split"],
            row["name"],
            _fmt(row["ocr_cer"], pct=True),
            _fmt(row["asr_wer"], pct=True),
            _fmt(row.get("word_p95_ms")),
            _fmt(row["rtf"]),
            str(len(row["errors"])),
        )
    out.print(rows)
    pooled = Table(title="pooled per split", title_justify="left")
    for column in ("split", "items", "OCR CER", "ASR WER", "ocr p95 ms", "word p50 / p95 ms"):
        pooled.add_column(column)
    for name, agg in result.splits.items():
        words = (
            f"{agg['word_ms_p50']:.0f} / {agg['word_ms_p95']:.0f}" if "word_ms_p95" in agg else "-"
        )
        pooled.add_row(
            name,
            str(agg["items"]),
            _fmt(agg["ocr_cer"], pct=True),
            _fmt(agg["asr_wer"], pct=True),
            _fmt(agg.get("ocr_ms_p95")),
            words,
        )
    out.print(pooled)


@app.command()
def bench(
    platform: Annotated[
        bool,
        typer.Option(
            "--platform",
            help="The platform report: mean end-to-end latency, the most concurrent live "
            "streams within the budget (found by ramping), power and energy, CPU/GPU, versions.",
        ),
    ] = False,
    clip: Annotated[
        Path | None, typer.Option(help="Clip the streams play (default: the bundled demo clip).")
    ] = None,
    clip_s: Annotated[float, typer.Option(help="Seconds of the clip each step plays.")] = 20.0,
    budget_s: Annotated[
        float, typer.Option(help="p95 event latency (and end lag) a step must stay within.")
    ] = 2.0,
    max_streams: Annotated[int, typer.Option(help="Stop the ramp here.")] = 8,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line.")] = False,
) -> None:
    """Measure what this machine sustains (`--platform`; docs/platform.md)."""
    from streamfuse.assets import demo_files
    from streamfuse.platform_report import Step, platform_report

    _setup_logging(False)
    if not platform:
        raise _fail("choose what to measure: --platform")
    if clip_s <= 0 or budget_s <= 0 or max_streams < 1:
        raise _fail("--clip-s and --budget-s must be positive, --max-streams at least 1")

    def progress(step: Step) -> None:
        verdict = "within budget" if step.within_budget else "over budget"
        err.print(
            f"{step.streams} stream(s): latency mean {step.latency_mean_ms:.0f} ms, "
            f"p95 {step.latency_p95_ms:.0f} ms, end lag {step.end_lag_s:.1f} s "
            f"(job end {step.job_end_lag_s:.1f} s), "
            f"{step.watts:.0f} W: {verdict}",
            highlight=False,
        )

    with demo_files() as files:
        path = clip or files.clip
        if not path.is_file():
            raise _fail(f"clip not found: {path}")
        try:
            report = asyncio.run(
                platform_report(
                    path,
                    budget_s=budget_s,
                    max_streams=max_streams,
                    clip_s=clip_s,
                    progress=progress,
                )
            )
        except StreamfuseError as e:
            raise _fail(str(e)) from None
    result = report.to_json()
    table = Table(title=f"platform: {result['machine']['cpu']}", title_justify="left")
    for column in ("platform", "mean latency", "streams within budget", "power", "energy"):
        table.add_column(column)
    machine = result["machine"]
    table.add_row(
        f"this machine ({machine['cores']} cores, GPU: {machine['gpu'] or '-'})",
        f"{result['mean_latency_ms']:.0f} ms (p95 {result['p95_latency_ms']:.0f})",
        f"{result['max_streams']} (p95 <= {budget_s:g} s)",
        f"{result['watts_at_max']} W" if result["watts_at_max"] is not None else "-",
        f"{result['joules_per_stream_minute']} J per stream-minute"
        if result["joules_per_stream_minute"] is not None
        else "-",
    )
    out.print(table)
    out.print(f"energy: {result['energy_note']}; models: {', '.join(result['models'])}")
    out.print(f"cpu frequency: {machine['cpufreq']}", highlight=False)
    if as_json:
        typer.echo(json.dumps(result))


@app.command()
def serve(
    host: Annotated[
        str, typer.Option(help="Address to listen on (0.0.0.0 opens it to the network).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 8765,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="STREAMFUSE_TOKEN",
            help="Token every route but /health requires (default: a random one, printed).",
        ),
    ] = None,
    max_sessions: Annotated[int, typer.Option(help="Sessions running at once.")] = 8,
    max_message_bytes: Annotated[
        int, typer.Option(help="Largest WebSocket message or request body.")
    ] = 4 << 20,
    idle_timeout_s: Annotated[
        float, typer.Option(help="End a live session after this long without input.")
    ] = 30.0,
    session_queue: Annotated[
        int,
        typer.Option(help="Results a subscriber may fall behind before it is disconnected."),
    ] = 1024,
    ask: Annotated[
        str | None,
        typer.Option(
            help="Standing question the language model answers in every session (a session "
            "may set its own; default: no language model)."
        ),
    ] = None,
    metrics_public: Annotated[
        bool, typer.Option("--metrics-public", help="Serve /metrics without the token.")
    ] = False,
    files: Annotated[
        bool,
        typer.Option("--files/--no-files", help="Let sessions read local files by path."),
    ] = True,
    asr_model: Annotated[str, typer.Option(help="tiny.en, base, or a model path.")] = "tiny.en",
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="Run URL and file sessions on a Ray cluster (`local`, `auto` or the head's "
            "HOST:PORT, as `run --ray`); live sessions and sessions with a question stay here.",
        ),
    ] = None,
    otlp: OtlpOption = None,
    trace_ratio: TraceRatioOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve the pipeline over HTTP: live browser camera/mic and text, URLs, a dashboard."""
    from pydantic import ValidationError

    from streamfuse.app import StreamfuseConfig
    from streamfuse.server import ServeConfig
    from streamfuse.server import serve as run_server

    _setup_logging(verbose)
    try:
        job = StreamfuseConfig(
            realtime=True,
            asr_config={"model": asr_model},
            telemetry=_telemetry_options(otlp, None, trace_ratio),
            lm={"ask": ask} if ask else None,
        )
        options: dict[str, Any] = {"token": token} if token else {}
        if ray_address is not None:
            _need_ray()
            options["ray"] = {"address": ray_address}
        config = ServeConfig(
            host=host,
            port=port,
            max_sessions=max_sessions,
            max_message_bytes=max_message_bytes,
            idle_timeout_s=idle_timeout_s,
            session_queue=session_queue,
            metrics_public=metrics_public,
            allow_files=files,
            job=job,
            **options,
        )
    except ValidationError as e:
        raise _fail(f"invalid option: {e.errors()[0]['msg']}") from None

    def announce(url: str) -> None:
        err.print(
            f"streamfuse serve on {url}\ndashboard: {url}/?token={config.token}",
            highlight=False,
            soft_wrap=True,
        )

    run_server(config, announce)


def _host_port(text: str, option: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise _fail(f"{option} expects HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


class KeepPolicyChoice(StrEnum):
    """`TransportConfig.keep_policy`."""

    deadline = "deadline"
    article = "article"
    fixed = "fixed"


class LinkChoice(StrEnum):
    """`TransportConfig.link`."""

    auto = "auto"
    udp = "udp"
    tcp = "tcp"


@app.command()
def edge(
    input_path: Annotated[str, typer.Argument(metavar="INPUT", help="Media file or URL.")],
    to: Annotated[str, typer.Option("--to", help="The cloud's HOST:PORT (UDP).")],
    realtime: Annotated[bool, typer.Option(help="Pace input at wall-clock speed (live).")] = False,
    ocr: Annotated[bool, typer.Option("--ocr/--no-ocr", help="Send key frames.")] = True,
    asr: Annotated[bool, typer.Option("--asr/--no-asr", help="Send speech.")] = True,
    keep_policy: Annotated[
        KeepPolicyChoice,
        typer.Option(help="How much of a key frame to send: deadline, article or fixed."),
    ] = KeepPolicyChoice.deadline,
    deadline_s: Annotated[float, typer.Option(help="Deadline of a message, seconds.")] = 1.5,
    link: Annotated[
        LinkChoice,
        typer.Option(help="auto: UDP, or TCP to the same port when UDP goes unanswered."),
    ] = LinkChoice.auto,
    faults: Annotated[
        str | None,
        typer.Option(
            help="Send through a local fault proxy, e.g. loss=0.05,delay_ms=50,jitter_ms=20 "
            "(streamfuse.testing.netfault.FaultConfig)."
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Edge end of an edge-cloud split: send key frames as sparse patch tokens and speech
    only (Opus) to `streamfuse cloud` over UDP; prints what was sent as one JSON line."""
    from pydantic import ValidationError

    from streamfuse.testing.netfault import FaultConfig
    from streamfuse.transport.config import TransportConfig
    from streamfuse.transport.edge import run_edge

    _setup_logging(verbose)
    host, port = _host_port(to, "--to")
    try:
        config = TransportConfig(
            keep_policy=keep_policy.value, deadline_s=deadline_s, link=link.value
        )
        fault_config = FaultConfig.parse(faults) if faults else None
    except (ValidationError, ValueError) as e:
        raise _fail(f"invalid option: {e}") from None
    try:
        report = asyncio.run(
            run_edge(
                input_path,
                host,
                port,
                transport=config,
                realtime=realtime,
                video=ocr,
                audio=asr,
                faults=fault_config,
            )
        )
    except StreamfuseError as e:
        raise _fail(str(e)) from None
    typer.echo(json.dumps(report.as_dict()))


@app.command()
def cloud(
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to receive on (UDP).")],
    out_path: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write events as JSON Lines here.")
    ] = None,
    asr_model: Annotated[
        str, typer.Option(help="tiny.en, base, or a path to a CTranslate2 Whisper model.")
    ] = "tiny.en",
    deadline_s: Annotated[float, typer.Option(help="Deadline of a message, seconds.")] = 1.5,
    idle_timeout_s: Annotated[
        float, typer.Option(help="Give up when no edge sends for this long.")
    ] = 60.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Cloud end of an edge-cloud split: receive one edge stream, run OCR and ASR on it and
    write the same events as a local run, plus a `link` record with the link's statistics."""
    from streamfuse.app import StreamfuseConfig
    from streamfuse.sinks import CollectSink, JsonlSink
    from streamfuse.transport.cloud import serve_cloud
    from streamfuse.transport.config import TransportConfig

    _setup_logging(verbose)
    host, port = _host_port(listen, "--listen")
    config = StreamfuseConfig(asr_config={"model": asr_model})
    collect = CollectSink()
    sinks: list[Any] = [collect]
    jsonl = JsonlSink(out_path) if out_path else None
    if jsonl:
        sinks.append(jsonl)

    def announce(address: tuple[str, int]) -> None:
        err.print(f"streamfuse cloud listening on udp://{address[0]}:{address[1]}")

    try:
        summary, link = asyncio.run(
            serve_cloud(
                host,
                port,
                config,
                sinks,
                transport=TransportConfig(deadline_s=deadline_s),
                idle_timeout_s=idle_timeout_s,
                on_listen=announce,
            )
        )
        if jsonl:
            jsonl.emit(summary)  # the run's final `stats` record, last, as `run` writes it
    except StreamfuseError as e:
        raise _fail(str(e)) from None
    finally:
        if jsonl:
            jsonl.close()
    for record in collect.records:
        if record["type"] in ("ocr", "asr"):
            text = record.get("text", "")
            out.print(
                f"[{record['t_start']:7.2f}] {record['type']}: {text}",
                highlight=False,
                soft_wrap=True,
            )
    typer.echo(json.dumps(link))  # one line, never wrapped to a console width


def main() -> None:
    app()


if __name__ == "__main__":
    main()
