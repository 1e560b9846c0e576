"""Virtual time for timing tests: `run_virtual(coro)` is `asyncio.run` on an event loop whose
clock jumps to the next timer whenever nothing is ready, with `now_wall()` reading that clock.

Sleeps, realtime pacing, rate limits and latencies then behave exactly as on an idle machine
that is infinitely fast: a test of "30 fps into a 10 fps stage for one second" takes
milliseconds and gives the same counts on every run, however loaded the CPU. Work in executor
threads (`Stage.run_blocking`) takes no virtual time: while any is running the loop waits for it
for real and the clock stands still.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple

from streamfuse.clock import use_wall_clock

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# How long (real seconds) one poll waits for executor threads before the loop looks again.
_THREAD_POLL_S = 0.05


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop on virtual time (see the module docstring)."""

    def __init__(self, start_s: float = 1000.0) -> None:
        super().__init__()
        self._now_s = start_s
        self._threads_running = 0
        selector: selectors.BaseSelector = self._selector  # type: ignore[attr-defined]
        real_select = selector.select

        def select(timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            ready = real_select(0)
            if ready or timeout == 0:
                return ready
            if self._threads_running:
                # Thread work is instantaneous on the virtual clock: wait for it, don't jump.
                return real_select(_THREAD_POLL_S)
            if timeout is None:
                return real_select(None)  # no timer at all: only I/O can wake the loop
            self._now_s += timeout
            return []

        selector.select = select  # type: ignore[method-assign]

    def time(self) -> float:
        return self._now_s

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*Ts], T], *args: *Ts
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._threads_running += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _future: object) -> None:
        self._threads_running -= 1


def run_virtual(main: Coroutine[Any, Any, T], *, start_s: float = 1000.0) -> T:
    """Run `main` to completion on a `VirtualTimeLoop` starting at `start_s`, with
    `streamfuse.clock.now_wall` reading the loop's clock meanwhile."""
    loop = VirtualTimeLoop(start_s)
    with use_wall_clock(loop.time), asyncio.Runner(loop_factory=lambda: loop) as runner:
        return runner.run(main)


__all__ = ["VirtualTimeLoop", "run_virtual"]
