"""The supervisor of `gateway serve`'s worker: started again after each death, waits backing off."""

from __future__ import annotations

import itertools
import logging
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from gateway.serving.supervisor import Backoff, Supervisor

pytestmark = pytest.mark.backend_independent


def test_the_wait_doubles_up_to_the_longest_and_starts_over_after_a_steady_run() -> None:
    backoff = Backoff(first=1, longest=30, steady=60)
    assert [backoff.after(2) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.after(61) == 1  # it ran a while: a new death, not the same one
    assert backoff.after(0.5) == 2


class FakeWorker:
    """A worker process that ends when the test says (``die``) or when terminated."""

    pids = itertools.count(1000)

    def __init__(self, command: Sequence[str]) -> None:
        self.command = list(command)
        self.pid = next(self.pids)
        self.ended = threading.Event()
        self.terminated = False

    def wait(self, timeout: float | None = None) -> int:
        if not self.ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.command, timeout or 0)
        return 0

    def die(self) -> None:
        self.ended.set()

    def terminate(self) -> None:
        self.terminated = True
        self.ended.set()

    def kill(self) -> None:
        self.ended.set()


class Spawner:
    def __init__(self) -> None:
        self.started: list[FakeWorker] = []
        self.changed = threading.Condition()

    def __call__(self, command: Sequence[str]) -> Any:
        with self.changed:
            self.started.append(FakeWorker(command))
            self.changed.notify_all()
            return self.started[-1]

    def wait_for(self, count: int) -> FakeWorker:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.started) >= count, timeout=10)
            return self.started[count - 1]


def test_a_worker_that_dies_is_started_again_and_one_that_is_stopped_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spawner = Spawner()
    supervisor = Supervisor(["gateway", "worker"], spawn=spawner,
                            backoff=Backoff(first=0.01, longest=0.02))
    with caplog.at_level(logging.INFO, logger="gateway.serving.supervisor"):
        supervisor.start()
        first = spawner.wait_for(1)
        first.die()
        second = spawner.wait_for(2)
        second.die()
        third = spawner.wait_for(3)
        assert supervisor.pid == third.pid
        supervisor.stop()
    assert third.terminated
    assert len(spawner.started) == 3
    assert all(worker.command == ["gateway", "worker"] for worker in spawner.started)
    restarts = [r.getMessage() for r in caplog.records if "stopped after" in r.getMessage()]
    assert [line.split(" stopped after ")[0] for line in restarts] == [
        f"the worker (pid {first.pid})", f"the worker (pid {second.pid})"]
    assert all(line.endswith("; starting another in 0 s") for line in restarts)
    assert sum("started the worker" in r.getMessage() for r in caplog.records) == 3


def test_a_worker_that_cannot_be_started_is_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spawner = Spawner()
    failures = iter([OSError(12, "Cannot allocate memory")])

    def spawn(command: Sequence[str]) -> Any:
        for failure in failures:
            raise failure
        return spawner(command)

    supervisor = Supervisor(["gateway", "worker"], spawn=spawn,
                            backoff=Backoff(first=0.01, longest=0.02))
    with caplog.at_level(logging.INFO, logger="gateway.serving.supervisor"):
        supervisor.start()
        spawner.wait_for(1)
        supervisor.stop()
    assert "the worker could not be started (Cannot allocate memory); trying again" \
        in caplog.text
