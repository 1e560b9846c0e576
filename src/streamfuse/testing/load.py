"""Inject CPU load on purpose: the "another process hogs the machine" scenario.

`CpuHog` starts `workers` processes that spin for `duration_s` after `delay_s`, in the
background, and stops them on `stop()` / context exit. Processes (not threads) so the load is
real contention for cores, as from another program.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from types import TracebackType


def _spin(delay_s: float, duration_s: float) -> None:
    time.sleep(delay_s)
    end = time.monotonic() + duration_s
    x = 0
    while time.monotonic() < end:
        for i in range(10_000):
            x = (x * 31 + i) % 1_000_003


class CpuHog:
    def __init__(self, workers: int = 1, *, delay_s: float = 0.0, duration_s: float = 30.0) -> None:
        self.workers = workers
        self.delay_s = delay_s
        self.duration_s = duration_s
        self._procs: list[mp.process.BaseProcess] = []

    def start(self) -> CpuHog:
        ctx = mp.get_context("spawn")
        for _ in range(self.workers):
            p = ctx.Process(target=_spin, args=(self.delay_s, self.duration_s), daemon=True)
            p.start()
            self._procs.append(p)
        return self

    def stop(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=2)
        self._procs.clear()

    def __enter__(self) -> CpuHog:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
