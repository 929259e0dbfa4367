"""Which CPU each gunicorn worker is given, and when the server pins them at all."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.serving import affinity
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


def options(*, pin_workers: bool) -> Options:
    return Options(host="127.0.0.1", port=8443, workers=2, threads=8, tls_files=None,
                   pin_workers=pin_workers)


def test_the_server_pins_its_workers_by_default_where_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = load_settings({"GATEWAY_INSTANCE_PATH": str(tmp_path),
                              "GATEWAY_SECRET_KEY": "s" * 40, "GATEWAY_TOKEN_PEPPER": "p" * 40})
    monkeypatch.setattr(affinity, "can_pin", lambda: True)
    config = gunicorn_config(settings, options(pin_workers=True))
    assert (config["pre_fork"], config["post_fork"]) == (affinity.PRE_FORK, affinity.POST_FORK)
    assert "pre_fork" not in gunicorn_config(settings, options(pin_workers=False))

    monkeypatch.setattr(affinity, "can_pin", lambda: False)
    assert "post_fork" not in gunicorn_config(settings, options(pin_workers=True))


def test_the_hooks_are_named_so_that_gunicorn_finds_them() -> None:
    # By name, so the benchmark's bare baseline can take them from JSON.
    for name, hook in ((affinity.PRE_FORK, affinity.assign_cpu),
                       (affinity.POST_FORK, affinity.pin_worker)):
        module, _, attribute = name.rpartition(".")
        assert module == affinity.__name__
        assert getattr(affinity, attribute) is hook
