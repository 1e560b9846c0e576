"""The sliding window of work seconds the effort ladder and the edge-read split share."""

from __future__ import annotations

import pytest

from streamfuse.qos.busy import BusyWindow

pytestmark = pytest.mark.unit


def test_work_leaves_the_window_once_it_ended_a_window_ago() -> None:
    busy = BusyWindow(window_s=10.0)
    busy.add(1.0, 2.0)
    busy.add(5.0, 0.5)
    busy.add(6.0, -1.0)  # a clock step backwards counts as no work
    assert busy.busy_s(6.0) == pytest.approx(2.5)
    assert busy.busy_s(11.0) == pytest.approx(0.5)  # ended at 1.0: out at 11.0
    assert busy.busy_s(15.5) == 0.0
    busy.add(16.0, 1.0)
    busy.clear()
    assert busy.busy_s(16.0) == 0.0


def test_a_window_needs_a_length() -> None:
    with pytest.raises(ValueError, match="window_s"):
        BusyWindow(0.0)
