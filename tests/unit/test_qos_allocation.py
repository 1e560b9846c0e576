"""Load-driven thread allocation: targets follow measured load, stay within the cores, move when
the load moves; leases never oversubscribe while cores are free; cpufreq read and set."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from streamfuse.frames import Frame
from streamfuse.pipeline.observer import FrameProcessed
from streamfuse.pipeline.stage import Stage
from streamfuse.qos.allocation import (
    AllocationConfig,
    CoreBudget,
    LoadMonitor,
    allocate,
    cpu_frequency,
    governor,
)

pytestmark = pytest.mark.unit


def test_the_loaded_stage_gets_the_spare_cores() -> None:
    plan = allocate({"ocr:a": 0.1, "asr:a": 0.6}, cores=4)
    assert plan.threads == {"ocr:a": 1, "asr:a": 3}
    plan = allocate({"ocr:a": 0.6, "asr:a": 0.1}, cores=4)
    assert plan.threads == {"ocr:a": 3, "asr:a": 1}


def test_spare_cores_split_in_proportion_to_load() -> None:
    plan = allocate({"a": 0.5, "b": 0.25, "c": 0.25}, cores=8)
    assert plan.threads == {"a": 4, "b": 2, "c": 2}


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize(
    "loads",
    [
        {"a": 0.9, "b": 0.05, "c": 0.3, "d": 0.0},
        {"a": 0.0, "b": 0.0},
        {f"s{i}": 0.1 * i for i in range(10)},
    ],
)
def test_targets_never_exceed_the_cores(cores: int, loads: dict[str, float]) -> None:
    plan = allocate(loads, cores=cores, limits={"a": 2})
    assert all(1 <= n <= cores for n in plan.threads.values())
    assert plan.threads.get("a", 1) <= 2  # its largest session
    active = [s for s in loads if s in plan.active]
    if len(active) <= cores:
        assert sum(plan.threads[s] for s in active) <= cores
    else:
        assert all(plan.threads[s] == 1 for s in active)


def test_idle_stages_keep_one_thread_and_reserve_nothing() -> None:
    plan = allocate({"busy": 0.5, "idle": 0.0}, cores=4, idle_share=0.02)
    assert plan.threads == {"busy": 4, "idle": 1}
    assert plan.reserved("idle") == 0 and plan.reserved("busy") == 4


class _Named(Stage):
    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        yield frame


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _feed(monitor: LoadMonitor, stage: Stage, busy_s: float) -> None:
    monitor.on_processed(FrameProcessed(stage, Frame(stream_id="s"), busy_s))


def test_monitor_rebalances_when_the_load_shifts() -> None:
    budget = CoreBudget(cores=4)
    budget.register("ocr:s", (1, 4))
    budget.register("asr:s", (1, 4))
    clock = _Clock()
    monitor = LoadMonitor(budget, AllocationConfig(window_s=5.0, interval_s=1.0), clock=clock)
    monitor.on_start(0.0)
    ocr, asr = _Named("ocr:s"), _Named("asr:s")
    # First 10 s: speech keeps ASR busy 60% of the time, OCR reads now and then.
    for step in range(1, 101):
        clock.t = step * 0.1
        _feed(monitor, asr, 0.06)
        if step % 20 == 0:
            _feed(monitor, ocr, 0.1)
    assert budget.allocation.threads["asr:s"] > budget.allocation.threads["ocr:s"]
    # Then slides change fast and the speaker pauses: OCR is the loaded stage.
    for step in range(101, 201):
        clock.t = step * 0.1
        _feed(monitor, ocr, 0.07)
        if step % 25 == 0:
            _feed(monitor, asr, 0.02)
    assert budget.allocation.threads["ocr:s"] > budget.allocation.threads["asr:s"]
    assert len(monitor.history) >= 15  # about once per `interval_s`, not per call
    assert len(monitor.history) <= 21


def test_monitor_ignores_stages_outside_the_budget() -> None:
    budget = CoreBudget(cores=2)
    budget.register("asr:s", (1, 2))
    clock = _Clock()
    monitor = LoadMonitor(budget, clock=clock)
    monitor.on_start(0.0)
    clock.t = 2.0
    _feed(monitor, _Named("change:s"), 1.0)
    assert not monitor.history
    assert set(monitor.shares(clock.t)) == {"asr:s"}


def test_a_lease_takes_free_cores_but_not_those_a_loaded_stage_reserved() -> None:
    budget = CoreBudget(cores=2)
    budget.register("ocr:s", (1, 2))
    budget.register("asr:s", (1, 2))
    # Nothing measured: the whole machine is free to whoever calls.
    with budget.lease("ocr:s") as n:
        assert n == 2
        with budget.lease("asr:s") as m:  # both cores are taken: it still runs, on one
            assert m == 1
    assert budget.in_use() == 0
    # ASR has load and a target of one core: OCR may not take that core while ASR is idle.
    budget.set_allocation(allocate({"ocr:s": 0.1, "asr:s": 0.5}, cores=2))
    with budget.lease("ocr:s") as n:
        assert n == 1
    # ASR busy a fifth of the time does not hold its core between calls: OCR may borrow it.
    budget.set_allocation(allocate({"ocr:s": 0.1, "asr:s": 0.2}, cores=2, reserve_share=0.5))
    with budget.lease("ocr:s") as n:
        assert n == 2
        with budget.lease("asr:s") as m:
            assert m == 1
    # With ASR idle for a while, OCR gets both cores again.
    budget.set_allocation(allocate({"ocr:s": 0.1, "asr:s": 0.0}, cores=2))
    with budget.lease("ocr:s") as n:
        assert n == 2


def test_a_lease_never_gets_fewer_threads_than_the_stages_floor() -> None:
    """The floor is the fixed split's share: with one stream on two cores OCR runs on two
    threads beside Whisper even while Whisper reserves its core, as under the fixed split."""
    budget = CoreBudget(cores=2)
    budget.register("ocr:s", (1, 2), floor=2)
    budget.register("asr:s", (1,), floor=1)
    budget.set_allocation(allocate({"ocr:s": 0.1, "asr:s": 0.8}, cores=2))
    assert budget.allocation.reserved("asr:s") == 1
    with budget.lease("asr:s") as m, budget.lease("ocr:s") as n:
        assert (m, n) == (1, 2)
    # Without the floor the reservation keeps OCR to the core Whisper leaves.
    budget.register("ocr:s", (1, 2))
    budget.set_allocation(allocate({"ocr:s": 0.1, "asr:s": 0.8}, cores=2))
    with budget.lease("ocr:s") as n:
        assert n == 1
    # A floor between the choices takes the largest choice under it.
    budget.register("x", (1, 2, 4), floor=3)
    with budget.lease("asr:s"), budget.lease("ocr:s"), budget.lease("x") as k:
        assert k == 2


def test_a_lease_takes_no_extra_thread_when_the_others_loads_fill_the_cores() -> None:
    """Four streams on two cores: no stage is busy enough to reserve a core, but together
    they want both. A call that finds them all between calls keeps to its own thread."""
    budget = CoreBudget(cores=2)
    loads = {}
    for i in range(4):
        budget.register(f"ocr:{i}", (1, 2))
        budget.register(f"asr:{i}", (1,))
        loads |= {f"ocr:{i}": 0.05, f"asr:{i}": 0.4}
    budget.set_allocation(allocate(loads, cores=2))
    assert not budget.allocation.reserving
    with budget.lease("ocr:0") as n:
        assert n == 1
    # The same stages lightly loaded (a core and more unwanted): the call takes two.
    budget.set_allocation(allocate({s: share / 4 for s, share in loads.items()}, cores=2))
    with budget.lease("ocr:0") as n:
        assert n == 2


def test_loaded_stages_calling_at_once_fit_in_the_cores() -> None:
    budget = CoreBudget(cores=4)
    for stage in ("a", "b", "c"):
        budget.register(stage, (1, 2, 4))
    budget.set_allocation(allocate({"a": 0.5, "b": 0.3, "c": 0.2}, cores=4, reserve_share=0.1))
    assert budget.allocation.threads == {"a": 2, "b": 1, "c": 1}
    with budget.lease("a") as a, budget.lease("b") as b, budget.lease("c") as c:
        assert (a, b, c) == (2, 1, 1)
        assert budget.in_use() == 4
    # `b` alone while `a` and `c` are loaded but not running: it keeps off their cores.
    with budget.lease("b") as b:
        assert b == 1


def test_leases_from_many_threads_are_all_given_back() -> None:
    budget = CoreBudget(cores=2)
    for i in range(4):
        budget.register(f"s{i}", (1, 2))
    seen: list[int] = []
    lock = threading.Lock()

    def calls(stage: str) -> None:
        for _ in range(200):
            with budget.lease(stage) as n, lock:
                seen.append(n)

    workers = [threading.Thread(target=calls, args=(f"s{i}",)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert budget.in_use() == 0
    assert len(seen) == 800 and set(seen) <= {1, 2}
    assert sum(sum(c.values()) for c in budget.granted.values()) == 800


def test_an_unregistered_stage_is_refused() -> None:
    from streamfuse.errors import ConfigError

    with pytest.raises(ConfigError, match="not registered"):
        CoreBudget(cores=2).grant("ocr:x")


def _cpufreq(root: Path, n: int, governor_name: str = "powersave", khz: int = 2_400_000) -> None:
    for i in range(n):
        d = root / f"cpu{i}" / "cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(governor_name + "\n")
        (d / "scaling_available_governors").write_text("performance powersave\n")
        (d / "scaling_cur_freq").write_text(f"{khz + i * 100_000}\n")
        (d / "cpuinfo_min_freq").write_text("800000\n")
        (d / "cpuinfo_max_freq").write_text("4800000\n")


def test_cpu_frequency_reads_governors_and_clocks(tmp_path: Path) -> None:
    _cpufreq(tmp_path, 2)
    freq = cpu_frequency(tmp_path)
    assert freq.exposed and freq.governors == ("powersave", "powersave")
    assert freq.cur_mhz == (2400, 2500) and (freq.min_mhz, freq.max_mhz) == (800, 4800)
    assert "governor powersave" in freq.summary()


def test_cpu_frequency_says_when_not_exposed(tmp_path: Path) -> None:
    (tmp_path / "cpu0").mkdir()
    freq = cpu_frequency(tmp_path)
    assert not freq.exposed and "not exposed" in freq.summary()


def test_governor_is_set_for_the_block_and_restored(tmp_path: Path) -> None:
    _cpufreq(tmp_path, 2)
    files = sorted(tmp_path.glob("cpu*/cpufreq/scaling_governor"))
    with governor("performance", tmp_path) as what:
        assert what.startswith("set governor performance")
        assert all(f.read_text().strip() == "performance" for f in files)
    assert all(f.read_text().strip() == "powersave" for f in files)
    with governor("performance", tmp_path / "none") as what:
        assert "not exposed" in what


def test_the_platform_report_states_the_cpu_frequency() -> None:
    from streamfuse.platform_report import machine_facts

    facts, freq = machine_facts(), cpu_frequency()
    if freq.exposed:  # clocks move between two reads: compare the governor only
        assert facts["cpufreq"].startswith(f"governor {facts['governor']}")
    else:
        assert facts["cpufreq"] == freq.summary() and "not exposed" in facts["cpufreq"]
        assert facts["governor"] == "not exposed" and facts["cpu_mhz"] is None


def test_the_platform_report_judges_the_last_result_and_reports_the_job_end() -> None:
    from streamfuse.platform_report import end_lags

    records = [
        {"type": "ocr", "wall_s": 3.0},
        {"type": "asr", "wall_s": 20.9},
        {"type": "asr_revision", "wall_s": 22.1},  # the reviser's last reading
        {"type": "stats", "wall_s": 22.2},
    ]
    assert end_lags(records, 20.0) == pytest.approx((0.9, 2.2))
    assert end_lags([], 20.0) == (-20.0, -20.0)
