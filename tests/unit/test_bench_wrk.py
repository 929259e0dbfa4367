"""The benchmark's wrk glue: reading wrk's report and writing its request script.

Only the parts that need no wrk binary and no server: the benchmark itself is
run by hand (bench/README.md), never in CI.
"""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

import pytest

from tests.bench_modules import BENCH, bench_module

pytestmark = pytest.mark.backend_independent

# wrk 4.1's report with --latency, in its own units and layout.
REPORT = """\
Running 10s test @ https://127.0.0.1:8443/healthz
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    10.95ms    9.03ms   1.02s    79.45%
    Req/Sec     1.62k   736.25     3.11k    49.15%
  Latency Distribution
     50%  850.00us
     75%   16.39ms
     90%   23.50ms
     99%    1.02s
  31538 requests in 10.01s, 5.12MB read
  Socket errors: connect 0, read 3, write 0, timeout 7
  Non-2xx or 3xx responses: 12
Requests/sec:   3150.65
Transfer/sec:    523.74KB
"""


@pytest.fixture(scope="module")
def wrk() -> ModuleType:
    """bench/wrk.py."""
    return bench_module("wrk")


def test_the_report_is_read_in_wrks_units(wrk: ModuleType) -> None:
    report = wrk.parse(REPORT)
    assert report.requests_per_second == 3150.65
    assert report.p50_ms == pytest.approx(0.85)
    assert report.latency_ms["75"] == pytest.approx(16.39)
    assert report.p99_ms == pytest.approx(1020.0)
    assert report.requests == 31538
    assert report.duration_s == pytest.approx(10.01)
    assert report.bytes_read == round(5.12 * 1024**2)
    assert report.socket_errors == {"connect": 0, "read": 3, "write": 0, "timeout": 7}
    assert report.error_responses == 12
    assert report.problems == ["12 responses >= 400", "3 socket read errors",
                               "7 socket timeout errors"]


def test_a_clean_report_has_no_problems(wrk: ModuleType) -> None:
    clean = "\n".join(line for line in REPORT.splitlines()
                      if "Socket errors" not in line and "Non-2xx" not in line)
    report = wrk.parse(clean)
    assert report.socket_errors == {"connect": 0, "read": 0, "write": 0, "timeout": 0}
    assert report.problems == []


def test_an_unreadable_report_is_an_error(wrk: ModuleType) -> None:
    with pytest.raises(wrk.WrkError, match="cannot read wrk's report"):
        wrk.parse("unable to connect to 127.0.0.1:1 Connection refused\n")


def test_lua_strings_hold_any_bytes(wrk: ModuleType) -> None:
    assert wrk.lua_string('a "b" \\') == r'"a \034b\034 \092"'
    # A digit after an escape must not join it: three digits, always.
    assert wrk.lua_string(b"\n1\xff") == r'"\0101\255"'


def test_the_script_sets_method_headers_and_body(wrk: ModuleType) -> None:
    scenarios = sys.modules["scenarios"]  # imported along with wrk
    request = scenarios.Request.with_json("POST", "/api/v1/things", {"a": 1},
                                          {"Authorization": "Bearer t"})
    script = wrk.lua_script(request)
    assert 'wrk.method = "POST"' in script
    assert 'wrk.headers["Content-Type"] = "application/json"' in script
    assert 'wrk.headers["Authorization"] = "Bearer t"' in script
    assert 'wrk.body = "{\\034a\\034:1}"' in script
    assert "function" not in script  # a static request: no Lua runs per request


def _report_at(wrk: ModuleType, rate: float) -> object:
    return wrk.parse(REPORT.replace("Requests/sec:   3150.65", f"Requests/sec:   {rate}"))


def test_the_table_shows_how_far_the_rounds_ratios_lie_apart(wrk: ModuleType) -> None:
    report = bench_module("report")
    result = report.ScenarioResult("read", "", "GET", "/x")
    # Round 1: the bare app slowed by someone else's work while it ran.
    for bare, gateway in ((1500.0, 1200.0), (3000.0, 1500.0)):
        result.targets["bare"].runs.append(_report_at(wrk, bare))
        result.targets["gateway"].runs.append(_report_at(wrk, gateway))
    assert result.ratios()["requests_per_second"] == pytest.approx(0.6)
    assert result.round_ratios() == [pytest.approx(0.8), pytest.approx(0.5)]
    ratio_row = next(line for line in report.table([result]).splitlines()
                     if "gateway/bare" in line)
    assert ratio_row.split()[1:3] == ["0.60x", "0.50-0.80"]
    assert result.as_json()["ratio_per_round"] == [0.8, 0.5]


def test_the_bare_app_does_not_import_the_gateway() -> None:
    code = ("import sys; import bare; bare.create_app(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'gateway'))")
    # From bench/, as the runner starts it: its folder is first on the path.
    result = subprocess.run([sys.executable, "-c", code], cwd=BENCH, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == "[]"
