"""Latency / accuracy / energy sweeps: the configuration grid, the non-dominated (Pareto) sort,
service-level objectives (SLOs) and the operating point they pick, and the energy figure.

A configuration is a `StreamfuseConfig` document (plain JSON, what `streamfuse run --config`
reads) plus a stream count; measuring one is the caller's job (`streamfuse pareto` runs the
pipeline, its energy from `streamfuse.qos.energy`: measured where counters are readable, else
a labelled CPU-time estimate), so this module knows no model package.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamfuse.errors import ConfigError

#: Lower is better for every metric a sweep reports; these four span the trade-off.
OBJECTIVES = ("latency_p95_s", "cer", "wer", "energy_j")

#: Metrics an SLO may name (seconds, error rates, CPU-seconds, joules).
METRICS = (
    "ocr_p50",
    "ocr_p95",
    "asr_p50",
    "asr_p95",
    "latency_p95_s",
    "cer",
    "wer",
    "cpu_s",
    "energy_j",
)


# -- the grid --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepConfig:
    """One point of the grid: the knobs, and the job config and stream count they make."""

    vision: str  # "fixed:<side px>" or "dynamic:<budget s>"
    ocr_precision: str
    asr_model: str
    beam: int
    update_interval_s: float
    lm: bool
    streams: int

    @property
    def name(self) -> str:
        lm = "lm" if self.lm else "nolm"
        return (
            f"{self.vision}/{self.ocr_precision}/{self.asr_model}/b{self.beam}/"
            f"u{self.update_interval_s:g}/{lm}/x{self.streams}"
        )

    def job_config(self, *, realtime: bool = True) -> dict[str, Any]:
        """The `StreamfuseConfig` document of this point (validated by the caller)."""
        kind, value = self.vision.split(":")
        policy: dict[str, Any] = {"kind": kind}
        if kind == "fixed":
            policy["det_max_side_px"] = int(value)
        else:
            policy["controller"] = {"budget_s": float(value)}
        doc: dict[str, Any] = {
            "realtime": realtime,
            "vision": {"policy": policy, "ocr": {"precision": self.ocr_precision}},
            "asr_config": {
                "model": self.asr_model,
                "beam_size": self.beam,
                "full_beam_size": self.beam,
                "update_interval_s": self.update_interval_s,
            },
        }
        if self.lm:
            doc["lm"] = {"ask": "What is this about?", "max_new_tokens": 16}
        return doc


@dataclass(frozen=True)
class SweepSpace:
    """The values each knob takes; `sample` draws configurations from their product."""

    vision: tuple[str, ...] = ("fixed:480", "fixed:640", "fixed:960", "dynamic:0.5", "dynamic:1")
    ocr_precision: tuple[str, ...] = ("int8", "fp32")
    asr_model: tuple[str, ...] = ("tiny.en", "base")
    beam: tuple[int, ...] = (1, 3)
    update_interval_s: tuple[float, ...] = (0.5, 1.0)
    lm: tuple[bool, ...] = (False, True)
    streams: tuple[int, ...] = (1, 2)

    def grid(self) -> list[SweepConfig]:
        return [
            SweepConfig(*values)
            for values in itertools.product(
                self.vision,
                self.ocr_precision,
                self.asr_model,
                self.beam,
                self.update_interval_s,
                self.lm,
                self.streams,
            )
        ]

    def sample(self, n: int, seed: int = 0) -> list[SweepConfig]:
        """`n` configurations (all of them when the grid is smaller), drawn so that every
        value of every knob appears about equally often: a shuffled grid, taken in rounds
        that each prefer the values used least so far (deterministic for a seed)."""
        grid = self.grid()
        if n >= len(grid):
            return grid
        rng = random.Random(seed)
        rng.shuffle(grid)
        counts: dict[tuple[str, Any], int] = {}
        chosen: list[SweepConfig] = []
        pool = list(grid)
        while len(chosen) < n:

            def use(c: SweepConfig) -> int:
                return sum(counts.get((k, v), 0) for k, v in vars(c).items())

            best = min(pool, key=use)
            pool.remove(best)
            chosen.append(best)
            for k, v in vars(best).items():
                counts[(k, v)] = counts.get((k, v), 0) + 1
        return chosen


# -- results, sorting, SLOs ---------------------------------------------------------------------


@dataclass
class Point:
    """A measured configuration: its name, job config, stream count and metrics."""

    name: str
    config: dict[str, Any]
    streams: int
    metrics: dict[str, float | None] = field(default_factory=dict)

    def value(self, metric: str) -> float:
        """The metric, +inf when missing (a run that produced no such event never wins)."""
        v = self.metrics.get(metric)
        return math.inf if v is None else float(v)


def dominates(a: Point, b: Point, objectives: Sequence[str] = OBJECTIVES) -> bool:
    """`a` is no worse than `b` on every objective and better on one."""
    av = [a.value(o) for o in objectives]
    bv = [b.value(o) for o in objectives]
    return all(x <= y for x, y in zip(av, bv, strict=True)) and any(
        x < y for x, y in zip(av, bv, strict=True)
    )


def pareto_ranks(points: Sequence[Point], objectives: Sequence[str] = OBJECTIVES) -> list[int]:
    """Non-dominated sorting (Deb et al. 2002): rank 0 is the frontier, rank 1 the frontier
    once rank 0 is removed, and so on."""
    n = len(points)
    dominated_by = [0] * n
    dominating: list[list[int]] = [[] for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        if dominates(points[i], points[j], objectives):
            dominating[i].append(j)
            dominated_by[j] += 1
        elif dominates(points[j], points[i], objectives):
            dominating[j].append(i)
            dominated_by[i] += 1
    ranks = [-1] * n
    front = [i for i in range(n) if dominated_by[i] == 0]
    rank = 0
    while front:
        nxt = []
        for i in front:
            ranks[i] = rank
            for j in dominating[i]:
                dominated_by[j] -= 1
                if dominated_by[j] == 0:
                    nxt.append(j)
        front, rank = nxt, rank + 1
    return ranks


def frontier(points: Sequence[Point], objectives: Sequence[str] = OBJECTIVES) -> list[Point]:
    return [p for p, r in zip(points, pareto_ranks(points, objectives), strict=True) if r == 0]


_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}
_CLAUSE = re.compile(r"^\s*([a-z0-9_]+)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Constraint:
    metric: str
    op: str
    bound: float

    def ok(self, point: Point) -> bool:
        v = point.metrics.get(self.metric)
        return v is not None and _OPS[self.op](float(v), self.bound)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_slo(text: str) -> list[Constraint]:
    """'ocr_p95<=1.0,wer<=0.10' -> constraints; latencies in seconds, error rates as
    fractions. Names the bad clause and the metrics allowed."""
    out = []
    for clause in filter(None, (c.strip() for c in text.split(","))):
        m = _CLAUSE.match(clause)
        if m is None:
            raise ConfigError(f"SLO clause {clause!r}: expected METRIC<=NUMBER (or <, >=, >)")
        metric, op, bound = m.groups()
        if metric not in METRICS:
            raise ConfigError(f"SLO metric {metric!r} unknown; one of {', '.join(METRICS)}")
        out.append(Constraint(metric, op, float(bound)))
    if not out:
        raise ConfigError(f"empty SLO {text!r}")
    return out


def choose(
    points: Sequence[Point], slo: Iterable[Constraint], *, prefer: str = "energy_j"
) -> Point | None:
    """The operating point: among the frontier points that meet every constraint, the one
    lowest in `prefer` (ties: lower p95 latency, then WER); when no frontier point meets it
    (an SLO on a metric outside the objectives, such as `ocr_p50`), any point that does.
    None when no point meets the SLO."""
    rules = list(slo)
    ok = [p for p in frontier(points) if all(c.ok(p) for c in rules)]
    if not ok:
        ok = [p for p in points if all(c.ok(p) for c in rules)]
    if not ok:
        return None
    return min(ok, key=lambda p: (p.value(prefer), p.value("latency_p95_s"), p.value("wer")))


# -- reporting ------------------------------------------------------------------------------------


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def table(points: Sequence[Point], chosen: Point | None = None) -> str:
    """A Markdown table of the points, frontier first, sorted by energy within each rank."""
    ranks = pareto_ranks(points)
    rows = sorted(zip(ranks, points, strict=True), key=lambda rp: (rp[0], rp[1].value("energy_j")))
    head = (
        "| rank | config | OCR p50 / p95 s | ASR p50 / p95 s | CER | WER | CPU s | energy J |\n"
        "|---:|---|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for rank, p in rows:
        m = p.metrics
        mark = " **(chosen)**" if chosen is not None and p is chosen else ""
        lines.append(
            f"| {rank} | `{p.name}`{mark} | {_fmt(m.get('ocr_p50'), 2)} / "
            f"{_fmt(m.get('ocr_p95'), 2)} | {_fmt(m.get('asr_p50'), 2)} / "
            f"{_fmt(m.get('asr_p95'), 2)} | {_fmt(m.get('cer'))} | {_fmt(m.get('wer'))} | "
            f"{_fmt(m.get('cpu_s'), 1)} | {_fmt(m.get('energy_j'), 0)} |"
        )
    return head + "\n".join(lines) + "\n"


def plot(points: Sequence[Point], path: Path, *, energy_label: str, chosen: Point | None) -> None:
    """Two panels: p95 latency against WER and against energy, frontier points highlighted
    (matplotlib, an optional dependency: `pip install streamfuse[plots]`)."""
    try:
        import matplotlib
    except ImportError as e:
        raise ConfigError("plotting needs matplotlib (pip install 'streamfuse[plots]')") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = pareto_ranks(points)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, metric, label in (
        (axes[0], "wer", "WER"),
        (axes[1], "energy_j", f"energy, J ({energy_label})"),
    ):
        for front, style in ((False, {"c": "lightgrey"}), (True, {"c": "C0"})):
            sel = [p for p, r in zip(points, ranks, strict=True) if (r == 0) == front]
            ax.scatter(
                [p.value("latency_p95_s") for p in sel],
                [p.value(metric) for p in sel],
                s=18,
                label="Pareto frontier" if front else "dominated",
                **style,
            )
        if chosen is not None:
            ax.scatter(
                [chosen.value("latency_p95_s")],
                [chosen.value(metric)],
                marker="*",
                s=160,
                c="C3",
                label="chosen (SLO)",
            )
        ax.set_xlabel("p95 event latency, s (max of OCR and ASR)")
        ax.set_ylabel(label, fontsize=8 if metric == "energy_j" else 10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_config(point: Point, path: Path) -> None:
    """The point's job config as JSON, the file `streamfuse run --config` reads (the stream
    count is how many inputs the run is given, not part of the config)."""
    path.write_text(json.dumps(point.config, indent=2) + "\n")


__all__ = [
    "METRICS",
    "OBJECTIVES",
    "Constraint",
    "Point",
    "SweepConfig",
    "SweepSpace",
    "choose",
    "dominates",
    "frontier",
    "pareto_ranks",
    "parse_slo",
    "plot",
    "table",
    "write_config",
]
