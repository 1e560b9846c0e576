"""Load-driven thread allocation (co-scheduling): model threads follow measured stage load.

`LoadMonitor` (a pipeline observer) measures each model stage's busy share over a trailing
window; every `interval_s` `allocate` turns those shares into per-stage thread targets (each
active stage at least one thread, the spare cores to the most loaded per thread, the targets of
the active stages never above the cores) and hands them to the `CoreBudget`. A model call asks
the budget for a `lease`: it gets the largest of its pre-made session sizes that fits in the
cores no other stage is using or has reserved (a stage busy at least `reserve_share` of the
time reserves its target), at least one: it never waits.

What run time can change: onnxruntime and CTranslate2 fix a session's threads when it is made,
so a stage holds one session per size (`thread_choices`: 1 and the most it may use) and each call
picks one. The language model's torch threads stay at the fixed split: `torch.set_num_threads`
is dynamic, but the LM engine sets its count once on its own thread (`streamfuse.lm.engine`).
`cpu_frequency` reports the cpufreq governor and clocks; `governor` sets one for a run where
the OS lets this process write it, and restores it after.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from streamfuse.errors import ConfigError
from streamfuse.pipeline.observer import FrameProcessed, Observer

log = logging.getLogger(__name__)

CPU_ROOT = Path("/sys/devices/system/cpu")


_HISTORY = 3600  # allocations kept in `LoadMonitor.history` (an hour at one a second)


class AllocationConfig(BaseModel):
    """How the main job splits the cores among its streams' model threads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["fixed", "load"] = Field(
        "fixed",
        description="`fixed`: every stream's OCR and ASR threads capped at cores // streams, "
        "set once. `load`: each model call takes threads from a shared budget of the cores, "
        "its stage's share following that stage's measured busy time (rebalanced every "
        "`interval_s`); see `streamfuse.qos.allocation`.",
    )
    cores: int | None = Field(
        None, ge=1, le=1024, description="Cores to allocate (None: the cores this process may use)."
    )
    ocr_max_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="Most intra-op threads one OCR read may use (`load`): each OCR model keeps "
        "a session with 1 thread and one with min(ocr_max_threads, cores).",
    )
    asr_max_threads: int = Field(
        1,
        ge=1,
        le=64,
        description="Most threads one Whisper call may use (`load`; > 1 loads a second model "
        "with that many). One: a second thread sped tiny/base up ~7% (docs/design.md) while "
        "taking the core an OCR read could use.",
    )
    window_s: float = Field(
        5.0, gt=0.0, le=600.0, description="Trailing window a stage's busy share is measured over."
    )
    interval_s: float = Field(
        1.0, gt=0.0, le=60.0, description="How often the thread targets are recomputed."
    )
    idle_share: float = Field(
        0.02,
        ge=0.0,
        le=1.0,
        description="Below this busy share a stage counts as idle: it keeps one thread and "
        "gets no share of the spare cores.",
    )
    reserve_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="A stage busy at least this share of the time keeps its target reserved "
        "between its calls (it will want the cores again within about one call); the targets "
        "of less loaded stages may be borrowed by a call that finds them idle.",
    )
    governor: str | None = Field(
        None,
        description="cpufreq governor to set for the run (e.g. `performance`) where this "
        "process may write it (restored after); None: leave it. Reported either way.",
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# -- the decision -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """Thread targets per stage, which stages had load when they were made and which of them
    were loaded enough to keep their target reserved between calls."""

    threads: Mapping[str, int]
    active: frozenset[str]
    loads: Mapping[str, float] = field(default_factory=dict)
    reserving: frozenset[str] = frozenset()

    def reserved(self, stage: str) -> int:
        """Threads `stage` holds for itself between calls (its target when it reserves)."""
        return self.threads.get(stage, 1) if stage in self.reserving else 0


def allocate(
    loads: Mapping[str, float],
    cores: int,
    *,
    limits: Mapping[str, int] | None = None,
    idle_share: float = 0.02,
    reserve_share: float = 0.5,
) -> Allocation:
    """Thread targets from busy shares: every stage gets one; the cores left once each active
    stage (share >= `idle_share`) has its one go, one at a time, to the active stage with the
    highest share per thread it already has (D'Hondt), within its limit. The active stages'
    targets never add up to more than `cores` (when there are more active stages than cores,
    each keeps one: a model call needs a thread). With no stage active (nothing measured yet)
    every stage counts as equally loaded. Stages busy at least `reserve_share` of the time
    reserve their targets (`Allocation.reserved`)."""
    if cores < 1:
        raise ConfigError(f"cores must be >= 1, got {cores}")
    limits = limits or {}
    threads = dict.fromkeys(loads, 1)
    active = [s for s, share in loads.items() if share >= idle_share]
    weights = dict(loads)
    if not active:
        active = list(loads)
        weights = dict.fromkeys(loads, 1.0)
    for _ in range(cores - len(active)):
        room = [s for s in active if threads[s] < min(cores, limits.get(s, cores))]
        if not room:
            break
        # Ties go to the stage first in `loads`, so the split is deterministic.
        best = max(room, key=lambda s: weights[s] / threads[s])
        threads[best] += 1
    real = frozenset(s for s, share in loads.items() if share >= idle_share)
    reserving = frozenset(s for s in real if loads[s] >= reserve_share)
    return Allocation(threads, real, dict(loads), reserving)


# -- the measurement ----------------------------------------------------------------------------


class LoadMonitor(Observer):
    """Busy share of each watched stage over the last `window_s` (from the runner's per-call
    busy time), turned into an `Allocation` for the budget every `interval_s` of wall time.

    Rebalancing runs inside `on_processed` (on the event loop, cheap: a few stages), so it
    needs no task of its own and stops with the pipeline.
    """

    def __init__(
        self,
        budget: CoreBudget,
        config: AllocationConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = budget
        self.config = config or AllocationConfig()
        self._clock = clock
        self._calls: dict[str, deque[tuple[float, float]]] = {}
        self._started: float | None = None
        self._last = float("-inf")
        #: The allocations made, with their times, the newest `_HISTORY` (benchmarks and tests
        #: read it; bounded: a run rebalances about once a second for as long as it lasts).
        self.history: deque[tuple[float, Allocation]] = deque(maxlen=_HISTORY)

    def on_start(self, wall: float) -> None:
        self._started = self._clock()

    def on_processed(self, event: FrameProcessed) -> None:
        name = event.stage.name
        if name not in self.budget.stages:
            return
        now = self._clock()
        self.record(name, event.busy_s, now)
        if now - self._last >= self.config.interval_s:
            self.rebalance(now)

    def record(self, stage: str, busy_s: float, now: float) -> None:
        """`stage` finished a call at `now` that kept it busy `busy_s`."""
        calls = self._calls.setdefault(stage, deque())
        calls.append((now, busy_s))
        while calls and calls[0][0] < now - self.config.window_s:
            calls.popleft()

    def shares(self, now: float) -> dict[str, float]:
        """Busy seconds per second of each budget stage over the window ending at `now`
        (a call's busy time counts whole at its end; a window shorter than `window_s` when
        the run is younger)."""
        start = self._started if self._started is not None else now - self.config.window_s
        span = max(1e-3, min(self.config.window_s, now - start))
        out = {}
        for stage in self.budget.stages:
            calls = self._calls.get(stage, ())
            busy = sum(b for t, b in calls if t >= now - self.config.window_s)
            out[stage] = min(1.0, busy / span)
        return out

    def rebalance(self, now: float | None = None) -> Allocation:
        now = self._clock() if now is None else now
        self._last = now
        plan = allocate(
            self.shares(now),
            self.budget.cores,
            limits=self.budget.limits,
            idle_share=self.config.idle_share,
            reserve_share=self.config.reserve_share,
        )
        self.budget.set_allocation(plan)
        self.history.append((now, plan))
        return plan


# -- the enforcement ----------------------------------------------------------------------------


class CoreBudget:
    """The cores the model calls share, leased per call in a stage's pre-made sizes.

    A lease never waits (a wait would add to the latency it is meant to cut): it gets the
    largest of the stage's `thread_choices` that fits in the cores neither in use by other
    stages' calls nor reserved by other stages (the target of a stage busy at least
    `reserve_share` of the time, less what it already holds), within its own target plus the
    cores nobody reserved; and at least the stage's `floor` (registered with it: the threads
    the fixed split gives it, so a call never gets fewer than under the fixed split; one
    thread with two or more streams on two cores). So the granted threads exceed the cores
    only by calls that start when none is free, each on its floor. Why a floor and not the
    reservation alone: with one stream on two cores the fixed split runs OCR on two threads
    beside Whisper's one, and `benchmarks/allocation.py` measured that oversubscription
    faster for OCR (p95 434 vs 599 ms, 3 repeats) at about the same ASR p95 (1994 vs 1908 ms)
    than OCR kept to the one core Whisper did not reserve. Thread-safe: leases are taken on
    the stages' worker threads.
    """

    def __init__(self, cores: int | None = None) -> None:
        self.cores = cores or usable_cores()
        self._choices: dict[str, tuple[int, ...]] = {}
        self._floors: dict[str, int] = {}
        self._in_use: dict[str, int] = {}
        self._plan = Allocation({}, frozenset())
        self._lock = threading.Lock()
        #: Leases granted per stage and thread count (benchmarks report it).
        self.granted: dict[str, dict[int, int]] = {}

    def thread_choices(self, max_threads: int) -> tuple[int, ...]:
        """The session sizes a model keeps: 1 and min(max_threads, cores)."""
        return tuple(sorted({1, max(1, min(max_threads, self.cores))}))

    def register(self, stage: str, choices: Sequence[int], *, floor: int = 1) -> None:
        """`stage` runs model calls through this budget with sessions of `choices` threads,
        each call on at least the largest choice not above `floor`."""
        if not choices or min(choices) < 1:
            raise ConfigError(f"{stage}: thread choices must be >= 1, got {list(choices)}")
        with self._lock:
            self._choices[stage] = tuple(sorted(set(choices)))
            self._floors[stage] = max([c for c in choices if c <= floor], default=min(choices))
            self._in_use.setdefault(stage, 0)
            self.granted.setdefault(stage, {})
            plan = allocate(dict.fromkeys(self._choices, 0.0), self.cores, limits=self.limits)
            self._plan = plan

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(self._choices)

    @property
    def limits(self) -> dict[str, int]:
        return {s: max(c) for s, c in self._choices.items()}

    @property
    def allocation(self) -> Allocation:
        return self._plan

    def set_allocation(self, plan: Allocation) -> None:
        with self._lock:
            self._plan = plan

    def in_use(self) -> int:
        with self._lock:
            return sum(self._in_use.values())

    def grant(self, stage: str) -> int:
        """Take threads for one call of `stage` (give them back with `release`)."""
        with self._lock:
            choices = self._choices.get(stage)
            if choices is None:
                raise ConfigError(f"stage {stage!r} is not registered with the core budget")
            plan = self._plan
            taken = sum(n for s, n in self._in_use.items() if s != stage)
            held = sum(
                max(0, plan.reserved(s) - self._in_use[s]) for s in self._choices if s != stage
            )
            room = min(self.cores - taken - held, plan.threads.get(stage, 1) + self._spare(stage))
            n = max([c for c in choices if c <= room], default=choices[0])
            n = max(n, self._floors[stage])
            self._in_use[stage] += n
            counts = self.granted[stage]
            counts[n] = counts.get(n, 0) + 1
            return n

    def _spare(self, stage: str) -> int:
        """Cores no stage has load for: an idle budget lets any call use them (the target
        only bounds what a stage may take while others need theirs). What the other stages'
        measured busy shares add up to is wanted, reserved or not (a core counts as free when
        less than half of it is wanted): on a machine the streams keep busy (four streams on
        two cores) a call finding the others between calls gets no extra thread, since they
        will soon want their cores back (`benchmarks/allocation.py --control` measured such
        grants 21% slower for OCR at 4 streams)."""
        plan = self._plan
        others = [s for s in self._choices if s != stage]
        reserved = sum(plan.reserved(s) for s in others)
        wanted = sum(plan.loads.get(s, 0.0) for s in others)
        own = plan.threads.get(stage, 1)
        free = min(self.cores - reserved, round(self.cores - wanted))
        return max(0, free - own)

    def release(self, stage: str, threads: int) -> None:
        with self._lock:
            self._in_use[stage] = max(0, self._in_use[stage] - threads)

    @contextmanager
    def lease(self, stage: str) -> Iterator[int]:
        """Threads for one model call of `stage`, held for the `with` block."""
        n = self.grant(stage)
        try:
            yield n
        finally:
            self.release(stage, n)


# -- CPU frequency ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuFrequency:
    """The cpufreq state of the machine, or why it is not known."""

    exposed: bool
    governors: tuple[str, ...] = ()
    cur_mhz: tuple[int, ...] = ()
    min_mhz: int | None = None
    max_mhz: int | None = None
    writable: bool = False
    note: str = ""

    def summary(self) -> str:
        if not self.exposed:
            return f"cpufreq not exposed ({self.note})"
        govs = "/".join(sorted(set(self.governors))) or "?"
        cur = f"{min(self.cur_mhz)}-{max(self.cur_mhz)} MHz" if self.cur_mhz else "? MHz"
        span = f", range {self.min_mhz}-{self.max_mhz} MHz" if self.max_mhz else ""
        return f"governor {govs}, now {cur}{span}" + ("" if self.writable else " (read-only)")

    def to_json(self) -> dict[str, object]:
        return {
            "exposed": self.exposed,
            "governors": sorted(set(self.governors)),
            "cur_mhz": list(self.cur_mhz),
            "min_mhz": self.min_mhz,
            "max_mhz": self.max_mhz,
            "writable": self.writable,
            "summary": self.summary(),
        }


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def cpu_frequency(root: Path = CPU_ROOT) -> CpuFrequency:
    """Governor and clocks of every CPU from `root/cpu*/cpufreq` (containers and many VMs do
    not expose it: then `exposed` is False and `note` says so)."""
    dirs = sorted(root.glob("cpu[0-9]*/cpufreq"), key=lambda p: int(p.parent.name[3:]))
    if not dirs:
        return CpuFrequency(False, note=f"no {root}/cpu*/cpufreq: the OS or VM hides it")
    governors: list[str] = []
    cur: list[int] = []
    lows: list[int] = []
    highs: list[int] = []
    for d in dirs:
        with suppress(OSError):
            governors.append((d / "scaling_governor").read_text().strip())
        khz = _read_int(d / "scaling_cur_freq")
        if khz is not None:
            cur.append(round(khz / 1000))
        for name, into in (("cpuinfo_min_freq", lows), ("cpuinfo_max_freq", highs)):
            v = _read_int(d / name)
            if v is not None:
                into.append(round(v / 1000))
    writable = all(os.access(d / "scaling_governor", os.W_OK) for d in dirs)
    return CpuFrequency(
        True,
        tuple(governors),
        tuple(cur),
        min(lows) if lows else None,
        max(highs) if highs else None,
        writable,
    )


@contextmanager
def governor(name: str | None, root: Path = CPU_ROOT) -> Iterator[str]:
    """Set every CPU's cpufreq governor to `name` for the block and restore each after, where
    the OS lets this process; yields what was done ("left as is", "set ...", or why not)."""
    if name is None:
        yield "left as is"
        return
    files = sorted(root.glob("cpu[0-9]*/cpufreq/scaling_governor"))
    if not files:
        yield f"cannot set governor {name}: cpufreq not exposed"
        return
    before: dict[Path, str] = {}
    try:
        for f in files:
            avail = f.with_name("scaling_available_governors")
            if avail.exists() and name not in avail.read_text().split():
                raise ConfigError(f"governor {name!r} not offered ({avail.read_text().strip()})")
            old = f.read_text().strip()
            f.write_text(name)
            before[f] = old
    except OSError as e:
        for f, old in before.items():
            f.write_text(old)
        log.warning("cannot set cpufreq governor %s: %s", name, e)
        yield f"cannot set governor {name}: {e.strerror or e}"
        return
    try:
        yield f"set governor {name} on {len(files)} CPUs"
    finally:
        for f, old in before.items():
            try:
                f.write_text(old)
            except OSError as e:
                log.warning("cannot restore governor %s on %s: %s", old, f, e)


__all__ = [
    "Allocation",
    "AllocationConfig",
    "CoreBudget",
    "CpuFrequency",
    "LoadMonitor",
    "allocate",
    "cpu_frequency",
    "governor",
    "usable_cores",
]
