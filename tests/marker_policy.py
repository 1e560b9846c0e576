"""Every test module declares its suite at module level: `pytestmark` with `unit`,
`integration` or `slow` (single tests may add `slow`). A module without one is a collection
error naming it, so the fast suite (`-m "not slow"`) never silently grows a slow test."""

from __future__ import annotations

from collections.abc import Generator

import pytest

SUITE_MARKERS = frozenset({"unit", "integration", "slow"})


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if isinstance(collector, pytest.Module) and report.passed:
        marks = {m.name for m in collector.own_markers}
        if not marks & SUITE_MARKERS:
            report.outcome = "failed"
            report.longrepr = (
                f"{collector.nodeid}: no suite marker; add "
                "`pytestmark = pytest.mark.unit` (or integration / slow) at module level"
            )
            report.result = []
    return report
