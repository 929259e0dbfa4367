"""Which CPU each gunicorn worker is given, and when the server pins them at all."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.serving import affinity, forks
from gateway.serving.server import Options, gunicorn_config
from gateway.settings import load_settings


@dataclass
class Worker:
    cpu: int | None = None


@dataclass
class Arbiter:
    WORKERS: dict[int, Any] = field(default_factory=dict)  # gunicorn's name

    def start(self, pid: int) -> Worker:
        worker = Worker()
        affinity.assign_cpu(self, worker)
        self.WORKERS[pid] = worker
        return worker


@pytest.fixture
def four_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # A server started with `taskset -c 2-5`: the CPUs it may use, not 0 to 3.
    monkeypatch.setattr(affinity.os, "sched_getaffinity", lambda pid: {5, 3, 2, 4})
    monkeypatch.setattr(affinity.os, "sched_setaffinity", lambda pid, cpus: None, raising=False)


@pytest.mark.usefixtures("four_cpus")
def test_workers_spread_over_the_cpus_the_server_may_use() -> None:
    arbiter = Arbiter()
    assert [arbiter.start(pid).cpu for pid in range(6)] == [2, 3, 4, 5, 2, 3]


@pytest.mark.usefixtures("four_cpus")
def test_a_replacement_takes_the_cpu_its_predecessor_left() -> None:
    arbiter = Arbiter()
    for pid in range(4):
        arbiter.start(pid)
    del arbiter.WORKERS[2]  # the worker on CPU 4 died
    assert arbiter.start(9).cpu == 4


def test_pin_worker_pins_the_calling_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, set[int]]] = []
    monkeypatch.setattr(affinity.os, "sched_setaffinity",
                        lambda pid, cpus: calls.append((pid, set(cpus))), raising=False)
    affinity.pin_worker(Arbiter(), Worker(cpu=3))
    assert calls == [(0, {3})]


def options(workers: int, *, pin_workers: bool = True) -> Options:
    return Options(host="127.0.0.1", port=8443, workers=workers, waits=8, tls_files=None,
                   pin_workers=pin_workers)


def pinned(tmp_path: Path, options: Options) -> bool:
    settings = load_settings({"GATEWAY_INSTANCE_PATH": str(tmp_path),
                              "GATEWAY_SECRET_KEY": "s" * 40, "GATEWAY_TOKEN_PEPPER": "p" * 40})
    config = gunicorn_config(settings, options)
    # Every worker runs the post-fork hook; a pinned one was given a CPU first.
    assert config["post_fork"] == forks.POST_FORK
    assert config.get("pre_fork") in (None, affinity.PRE_FORK)
    return config.get("pre_fork") == affinity.PRE_FORK


@pytest.mark.usefixtures("four_cpus")
def test_workers_are_pinned_when_asked_and_there_is_one_for_each_cpu(tmp_path: Path) -> None:
    assert pinned(tmp_path, options(4))
    assert pinned(tmp_path, options(6))
    assert not pinned(tmp_path, options(4, pin_workers=False))


@pytest.mark.usefixtures("four_cpus")
def test_workers_are_not_pinned_unless_asked(tmp_path: Path) -> None:
    assert not pinned(tmp_path, Options(host="127.0.0.1", port=8443, workers=4, waits=8,
                                        tls_files=None))


@pytest.mark.usefixtures("four_cpus")
def test_fewer_workers_than_cpus_are_left_to_the_kernel(tmp_path: Path) -> None:
    # Several small servers on one host would otherwise all start on the first CPUs.
    assert not pinned(tmp_path, options(1))
    assert not pinned(tmp_path, options(3))


def test_one_cpu_is_nothing_to_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(affinity.os, "sched_getaffinity", lambda pid: {0})
    assert not pinned(tmp_path, options(2))


def test_the_hooks_are_named_so_that_gunicorn_finds_them() -> None:
    # By name, so the benchmark's bare baseline can take them from JSON.
    for name, module, hook in ((affinity.PRE_FORK, affinity, affinity.assign_cpu),
                               (forks.POST_FORK, forks, forks.worker_forked)):
        module_name, _, attribute = name.rpartition(".")
        assert module_name == module.__name__
        assert getattr(module, attribute) is hook


def test_a_new_worker_stops_at_once_until_it_sets_its_own_handlers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The master's handlers, copied by the fork, would only queue a stop.
    handlers: dict[int, object] = {}
    monkeypatch.setattr(forks.signal, "signal", lambda number, handler: handlers.update(
        {number: handler}))
    pinned_to: list[int] = []
    monkeypatch.setattr(affinity, "pin_worker", lambda arbiter, worker: pinned_to.append(
        worker.cpu))
    forks.worker_forked(Arbiter(), Worker(cpu=None))
    assert handlers == {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.SIG_DFL}
    assert pinned_to == []
    forks.worker_forked(Arbiter(), Worker(cpu=1))
    assert pinned_to == [1]
