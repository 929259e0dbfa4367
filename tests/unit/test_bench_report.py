"""The benchmark's report: a run that held no requests prints without held figures."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_modules import bench_module

pytestmark = pytest.mark.backend_independent


@pytest.fixture(scope="module")
def report() -> ModuleType:
    """bench/report.py."""
    return bench_module("report")


def measured(report: ModuleType) -> object:
    wrk = bench_module("wrk")
    result = report.ScenarioResult(name="read", description="", method="GET", path="/x")
    for rate, target in zip((100.0, 50.0), result.targets.values(), strict=True):
        target.runs.append(wrk.Report(
            requests_per_second=rate, latency_ms={"50": 1.0, "99": 2.0}, requests=100,
            duration_s=1.0, bytes_read=1000, error_responses=0, raw="",
            socket_errors=dict.fromkeys(("connect", "read", "write", "timeout"), 0)))
    return result


def test_a_run_that_held_nothing_prints_without_held_figures(report: ModuleType) -> None:
    result = measured(report)
    table = report.table([result])
    assert "held requests on" not in table
    assert "0.50x" in table
    assert "held" not in result.as_json()["targets"]["gateway"]


def test_holds_that_sent_nothing_print_as_such(report: ModuleType) -> None:
    result = measured(report)
    stats = bench_module("hold").HoldStats
    for target in result.targets.values():
        target.holds.append(stats(count=0))
    assert "0/0 ok" in report.table([result])
    assert result.as_json()["targets"]["gateway"]["held"]["mean_answer_s"] is None
