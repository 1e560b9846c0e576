"""How busy a worker has been lately: seconds of work summed over a sliding window.

Two controllers ask it: the ASR effort ladder (`audio.effort`, recognizer seconds per second
of audio, on the media clock) and the edge's read split (`transport.policy.EdgeReadPolicy`,
the edge's blocking work, on the wall clock).
"""

from __future__ import annotations

from collections import deque


class BusyWindow:
    """Seconds of work, each stamped with the time it ended, summed over the last `window_s`.

    One clock per window, whichever the caller keeps (wall or media time); work stamped at or
    before `now - window_s` has left the window.
    """

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._work: deque[tuple[float, float]] = deque()  # (end time, seconds)

    def add(self, t: float, seconds: float) -> None:
        """`seconds` of work that ended at time `t` (negative counts as none)."""
        self._work.append((t, max(0.0, seconds)))

    def busy_s(self, now: float) -> float:
        """Seconds of work in the window ending at `now`."""
        while self._work and self._work[0][0] <= now - self.window_s:
            self._work.popleft()
        return sum(s for _, s in self._work)

    def clear(self) -> None:
        self._work.clear()


__all__ = ["BusyWindow"]
