"""Benchmark the gateway against a bare Flask app on the same gunicorn, TLS and load.

    .venv/bin/python bench/run.py [--database sqlite|postgres] [--scenario NAME ...]
                                  [--duration S] [--connections N] [--wrk-threads N]
                                  [--workers N] [--waits N] [--pin-workers]
                                  [--rounds N] [--warmup S] [--hold N] [--floor] [--json PATH]

One run starts both servers from scratch, measures every chosen scenario on
each with wrk (alternating targets, so drift hits both alike), prints the
table and writes the JSON results. With ``--floor``, a third target, the bare
app making each scenario's database statements (floor.py), shows how much of
the gap to the bare app no implementation could close. It is a benchmark, not
a test: numbers depend on the machine, and nothing here fails on a slow result.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import os
import platform
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

import report
import servers
import wrk
from hold import HeldRequests, HoldStats
from scenarios import SCENARIOS, Gateway, Request, Scenario, SetupError, send

RESULTS_FOLDER = Path(__file__).with_name("results")
# gateway serve's own default: a held long-poll is a greenlet, and each
# worker holds this many (nothing makes held connections split evenly between
# the workers, so each can hold them all).
DEFAULT_WAITS = 10_000


class ScenarioFailed(Exception):
    """A scenario could not be measured; the message says why. Other scenarios go on."""


@dataclass(frozen=True, slots=True)
class Load:
    """What wrk does to each target, identically."""

    duration: int
    connections: int
    threads: int
    rounds: int
    warmup: int


@dataclass(frozen=True, slots=True)
class Target:
    """A server under load."""

    name: str
    port: int
    cafile: Path

    def url(self, path: str) -> str:
        """Where wrk points; loopback by address, which the certificate names too."""
        return f"https://{servers.HOST}:{self.port}{path}"


# --- the command line -------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options; defaults sized for a 2-core machine and a run of about a minute."""
    parser = argparse.ArgumentParser(
        description="Benchmark the gateway against a bare Flask app (same gunicorn, TLS, load).")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite",
                        help="postgres: a scratch database on TEST_DATABASE_URL "
                             f"(default {servers.DEFAULT_POSTGRES_URL})")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                        metavar="NAME", help="run only this scenario (repeatable); default: "
                        + ", ".join(s.name for s in SCENARIOS.values() if s.in_default_run))
    parser.add_argument("--duration", type=_positive, default=10,
                        help="seconds per measured wrk run (default 10)")
    parser.add_argument("--connections", type=_positive, default=32,
                        help="wrk connections (default 32)")
    parser.add_argument("--wrk-threads", type=_positive, default=2,
                        help="wrk threads (default 2)")
    # --workers and --waits mean what they mean to `gateway serve`.
    parser.add_argument("--workers", type=_positive, default=2,
                        help="gunicorn worker processes, both servers (default 2)")
    parser.add_argument("--waits", type=_positive, default=DEFAULT_WAITS,
                        help="long-polls each gateway worker holds "
                             f"(default {DEFAULT_WAITS})")
    parser.add_argument("--pin-workers", action="store_true",
                        help="keep each worker on a CPU of its own, both servers (as "
                             "`gateway serve --pin-workers`)")
    parser.add_argument("--rounds", type=_positive, default=2,
                        help="measured runs per target and scenario (default 2)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="seconds of unmeasured load per target first (default 2)")
    parser.add_argument("--hold", type=int, metavar="N",
                        help="held requests for scenarios that hold some (0: none)")
    parser.add_argument("--floor", action="store_true",
                        help="also measure the bare app making each scenario's database "
                             "statements (floor.py): the most any implementation of them "
                             "could reach")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="where to write the results (default bench/results/<time>.json)")
    args = parser.parse_args(argv)
    if args.connections < args.wrk_threads:
        parser.error("--connections must be at least --wrk-threads (wrk's rule)")
    return args


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def chosen_scenarios(names: list[str] | None, hold_count: int | None) -> list[Scenario]:
    """The named scenarios, else the default run; with the held count overridden."""
    picked = ([SCENARIOS[name] for name in dict.fromkeys(names)] if names
              else [s for s in SCENARIOS.values() if s.in_default_run])
    if hold_count is None:
        return picked
    return [dataclasses.replace(s, hold=dataclasses.replace(s.hold, count=hold_count)
                                if hold_count > 0 else None) if s.hold else s
            for s in picked]


# --- the run -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 1 with a one-line message when it cannot, 130 when stopped."""
    args = parse_args(argv)
    # SIGTERM takes the same way out as Ctrl-C: servers stopped, scratch removed.
    # SIGINT explicitly too: a shell starting us in the background ignores it.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        return run(args)
    except servers.BenchSetupError as error:
        if error.detail:
            print(error.detail, file=sys.stderr)
        return _fail(str(error))
    except wrk.WrkError as error:
        return _fail(str(error).splitlines()[0])
    except KeyboardInterrupt:
        return _fail("interrupted; servers stopped and scratch files removed", status=130)


def run(args: argparse.Namespace) -> int:
    """Set up both targets, measure each scenario, report; undo the setup in any case."""
    scenarios = chosen_scenarios(args.scenario, args.hold)
    capacity = args.waits
    for scenario in scenarios:
        if scenario.hold and scenario.hold.count > capacity:
            _progress(f"{scenario.name}: {scenario.hold.count} held requests, but a gateway "
                      f"worker holds at most {capacity} (--waits); those "
                      "past that on one worker are answered at once and sent again")
    wrk_path = wrk.ensure_installed()
    load = Load(duration=args.duration, connections=args.connections, threads=args.wrk_threads,
                rounds=args.rounds, warmup=max(args.warmup, 0))
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gateway-bench-")))
        database_url = stack.enter_context(servers.scratch_database(args.database))
        gateway, targets, config = stack.enter_context(
            _targets(folder, database_url, args.workers, args.waits, floor=args.floor,
                     pin_workers=args.pin_workers))
        facts = machine_facts(args, load, wrk.version(wrk_path),
                              servers.describe_database(database_url), config)
        print(report.header(facts), end="\n\n", flush=True)
        results = [measure(scenario, gateway, targets, load, wrk_path, folder)
                   for scenario in scenarios]
    print(report.table(results))
    path = args.json or RESULTS_FOLDER / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    report.write_json(path, facts, config, results)
    print(f"\nresults: {path}")
    return 0 if all(result.measured for result in results) else 1


@contextlib.contextmanager
def _targets(folder: Path, database_url: str | None, workers: int, waits: int, *,
             floor: bool, pin_workers: bool,
             ) -> Iterator[tuple[Gateway, dict[str, Target], dict[str, Any]]]:
    """The servers started on one gunicorn config (bind port aside); stopped afterwards.

    With ``floor``, a second bare app besides, making each scenario's floor
    statements on the gateway's database (PostgreSQL) or a file beside it.
    """
    instance = folder / "instance"
    gateway_port = servers.free_port()
    bare_port = servers.free_port(gateway_port)
    floor_port = servers.free_port(gateway_port, bare_port)
    environ = servers.scratch_environ(instance, gateway_port, database_url)
    _progress("creating the scratch instance (gateway init, gateway db upgrade)")
    servers.init_instance(environ, folder)
    options = servers.gateway_options(gateway_port, workers, waits, instance,
                                      pin_workers=pin_workers)
    config = servers.server_config(environ, options)
    # The same function gateway serve calls, with only the port changed.
    bare_config = servers.server_config(environ, dataclasses.replace(options, port=bare_port))
    with contextlib.ExitStack() as stack:
        _progress(f"starting the gateway on port {gateway_port}")
        gateway = stack.enter_context(servers.run_gateway(environ, folder, options))
        _progress(f"starting the bare app on port {bare_port}")
        stack.enter_context(servers.run_bare(bare_config, bare_port, folder, environ,
                                             gateway.cafile))
        targets = {"bare": Target("bare", bare_port, gateway.cafile),
                   "gateway": Target("gateway", gateway_port, gateway.cafile)}
        if floor:
            _progress(f"starting the bare app with the database floor on port {floor_port}")
            floor_config = servers.server_config(
                environ, dataclasses.replace(options, port=floor_port))
            stack.enter_context(servers.run_bare(
                floor_config, floor_port, folder, environ, gateway.cafile, name=report.FLOOR,
                floor=servers.floor_database(folder, database_url)))
            targets[report.FLOOR] = Target(report.FLOOR, floor_port, gateway.cafile)
        yield gateway, targets, config


def measure(scenario: Scenario, gateway: Gateway, targets: dict[str, Target], load: Load,
            wrk_path: str, folder: Path) -> report.ScenarioResult:
    """Every target under the scenario's load, alternating; a failure fails this one only."""
    # The floor only where the scenario makes statements: else it is the bare app again.
    targets = {name: target for name, target in targets.items()
               if name != report.FLOOR or scenario.floor}
    result = report.ScenarioResult(name=scenario.name, description=scenario.description,
                                   method=scenario.request.method,
                                   path=scenario.request.path,
                                   targets={name: report.TargetResult() for name in targets})
    try:
        request = scenario.prepare(gateway)
        held = scenario.hold.prepare(gateway) if scenario.hold else None
        # A request cycling over paths is shown by its pattern ("/e/{id}").
        result.path = scenario.request.path if request.paths else request.path
        for target in targets.values():
            _check(target, request, scenario.expected_status)
        script = folder / f"{scenario.name}.lua"
        script.write_text(wrk.lua_script(request))
        # With request.paths, each run starts where the last one against the
        # same target stopped; the check above used the first path.
        pool = _Pool(request, load.threads, tuple(targets))
        if load.warmup:
            for target in targets.values():
                _progress(f"{scenario.name}: warm-up on {target.name}")
                pool.ran(target.name, wrk.run(
                    wrk_path, target.url(request.path), script, duration=load.warmup,
                    connections=load.connections, threads=load.threads,
                    args=pool.args(target.name)))
        for number in range(load.rounds):
            # Alternate which target goes first, so none always runs warmer.
            order = list(targets) if number % 2 == 0 else list(targets)[::-1]
            for name in order:
                run, stats = _measured_run(scenario, targets[name], request, held, script,
                                           load, wrk_path, pool.args(name))
                pool.ran(name, run)
                result.targets[name].runs.append(run)
                if stats:
                    result.targets[name].holds.append(stats)
                _progress(f"{scenario.name}: round {number + 1}/{load.rounds}, {name}: "
                          f"{run.requests_per_second:,.0f} req/s, p99 {run.p99_ms:.2f} ms")
        if scenario.consumed:
            _progress(f"{scenario.name}: " + pool.verify(scenario.consumed(gateway)))
    except (SetupError, ScenarioFailed, wrk.WrkError) as error:
        result.error = str(error)
        _progress(f"{scenario.name}: FAILED: {error}")
    return result


class _Pool:
    """Where each target's next run starts in a request's ``paths``, and what they used.

    The gateway must never come back to a path: for ``submit`` that would be a
    second submit to a completed elicitation, which measures something else.
    The bare app cycles over the same paths in the same way (its script wraps
    around the list, which changes nothing there).
    """

    def __init__(self, request: Request, threads: int, targets: tuple[str, ...]) -> None:
        self._request = request
        self._threads = threads
        self._next = dict.fromkeys(targets, 1 if request.paths else 0)
        # Gateway requests answered (wrk's count, the check's one included) and sent.
        self._answered = 1
        self._sent = 1

    def args(self, target: str) -> tuple[str, ...]:
        return wrk.script_args(self._request, self._next[target], self._threads)

    def ran(self, target: str, run: wrk.Report) -> None:
        """Move on past the paths this run used; fail once the gateway's have run out."""
        if not self._request.paths:
            return
        self._next[target] += wrk.paths_used(run, self._threads)
        if target != "gateway":
            return
        self._answered += run.requests
        self._sent += run.paths_sent or 0
        size = len(self._request.paths)
        if self._next[target] > size:
            raise ScenarioFailed(
                f"the {size:,} paths ran out: the gateway's runs needed {self._next[target]:,}, "
                "so some requests went to a path used before; run fewer or shorter rounds "
                "of this scenario, or raise its pool (SUBMIT_POOL in bench/scenarios.py)")

    def verify(self, consumed: int) -> str:
        """Every answer the gateway gave used up a path of its own: else the numbers lie."""
        line = (f"{consumed:,} of the {len(self._request.paths):,} paths used up on the "
                f"gateway; it answered {self._answered:,} requests, {self._sent:,} were sent")
        if consumed < self._answered:
            raise ScenarioFailed(line + ": fewer used up than answered, so some answers "
                                 "did not do the scenario's work")
        return line


def _measured_run(scenario: Scenario, target: Target, request: Request, held: Request | None,
                  script: Path, load: Load, wrk_path: str,
                  args: tuple[str, ...] = ()) -> tuple[wrk.Report, HoldStats | None]:
    """One wrk run, with the scenario's held requests open around it when it has any."""
    url = target.url(request.path)
    if scenario.hold is None or held is None:
        return wrk.run(wrk_path, url, script, duration=load.duration,
                       connections=load.connections, threads=load.threads, args=args), None
    holding = HeldRequests(servers.HOST, target.port, held, scenario.hold.count, target.cafile,
                           scenario.hold.expected_status, settle_s=scenario.hold.settle_s,
                           drain_s=scenario.hold.drain_s)
    with holding:
        run = wrk.run(wrk_path, url, script, duration=load.duration,
                      connections=load.connections, threads=load.threads, args=args)
    return run, holding.stats


def _check(target: Target, request: Request, expected: int) -> None:
    """One request answered as expected, before any load: else the numbers mean nothing.

    Held requests are not checked this way (a long-poll would take its whole
    wait); their statuses are counted while they run.
    """
    what = f"{request.method} {request.path}"
    try:
        status, body = send(servers.HOST, target.port, request, target.cafile)
    except (OSError, http.client.HTTPException) as error:
        raise ScenarioFailed(f"{target.name}: {what} failed: {error}") from None
    if status != expected:
        raise ScenarioFailed(f"{target.name} answered {what} with {status}, expected "
                             f"{expected}: {body[:120]!r}")


# --- facts and messages ------------------------------------------------------------


def machine_facts(args: argparse.Namespace, load: Load, wrk_version: str,
                  database: str, config: dict[str, Any]) -> dict[str, str]:
    """What a reader needs to compare this run with another one (``config``: gunicorn's)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC",
        "machine": f"{os.cpu_count()} CPUs ({usable} usable), {_cpu_model()}, "
                   f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "system": platform.platform(terse=True),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "servers": f"gunicorn {metadata.version('gunicorn')} {config['worker_class']}, "
                   f"{args.workers} workers, {args.waits} waits each"
                   f"{servers.describe_pinning(config)}, "
                   f"TLS on loopback; Flask {metadata.version('flask')}",
        "database": database,
        "rate limits": f"limiter on, {servers.UNREACHABLE_LIMIT} per token and per address "
                       "(out of the load's reach)",
        "load": f"{wrk_version}, {load.threads} threads, {load.connections} connections, "
                f"{load.duration} s per run",
        "rounds": f"{load.rounds} per target, alternating, after {load.warmup} s warm-up",
        "floor": "the bare app making each scenario's database statements (floor.py)"
                 if args.floor else "not measured (--floor)",
    }


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "unknown CPU"


def _progress(message: str) -> None:
    """Progress on stderr, so stdout holds only the header and the table."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _fail(message: str, status: int = 1) -> int:
    print(f"bench: {message}", file=sys.stderr)
    return status


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
