"""A worker that dies mid-delivery, or comes back after its lease ran out."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from flask import Flask

from gateway.clock import FixedClock
from gateway.webhooks.dispatcher import LEASE, Dispatcher
from tests.conftest import Api
from tests.integration.webhooks.conftest import Fault, Receiver, attempts, end_one, events

pytestmark = pytest.mark.slow


def test_a_worker_killed_mid_delivery_is_taken_over_once_its_lease_runs_out(
    app: Flask, hooked_api: Api, receiver: Receiver, cli_environ: dict[str, str],
    tmp_path: Path, make_dispatcher: Callable[..., Dispatcher],
) -> None:
    receiver.script = [Fault.HANG]  # the receiver holds the first request
    end_one(hooked_api)
    log = tmp_path / "worker.log"
    with log.open("w") as output:
        worker = subprocess.Popen([sys.executable, "-m", "gateway", "worker"], env=cli_environ,
                                  cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT)
    try:
        held = receiver.wait_for(1, timeout=30)
        assert len(held) == 1, log.read_text()
        [event] = events(app)
        assert (event.status, event.attempts) == ("delivering", 1)
        assert event.lease_until is not None
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    assert worker.returncode == -signal.SIGKILL

    # Another worker, right away: the dead one's claim still stands.
    assert make_dispatcher(clock=FixedClock(datetime.now(UTC))).run_once() == 0
    # Once the lease has run out, the next worker sends the event again.
    after_lease = FixedClock(datetime.now(UTC) + LEASE + timedelta(seconds=1))
    assert make_dispatcher(clock=after_lease).run_once() == 1
    [event] = events(app)
    assert (event.status, event.attempts) == ("delivered", 2)
    assert receiver.ids() == [event.id, event.id]
    assert receiver.deliveries[0].body == receiver.deliveries[1].body
    # The killed attempt never got to write its outcome; the second did.
    assert [(a.number, a.outcome) for a in attempts(app, event.id)] == [(2, "delivered")]


def test_a_worker_back_after_its_lease_ran_out_does_not_overwrite_the_outcome(
    app: Flask, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher], caplog: pytest.LogCaptureFixture,
) -> None:
    receiver.script = [500]
    end_one(hooked_api)
    slow, other = make_dispatcher(), make_dispatcher()
    [stale] = slow.claim(1)
    clock.advance(seconds=LEASE.total_seconds() + 1)
    [fresh] = other.claim(1)
    assert (stale.event_id, stale.attempt, fresh.attempt) == (fresh.event_id, 1, 2)
    assert other.deliver(fresh).delivered is False  # the 500
    # The stale worker finally sends (204 now) and records: too late to change anything.
    with caplog.at_level(logging.WARNING, logger="gateway.webhooks.dispatcher"):
        assert slow.deliver(stale).delivered is True
    assert f"the lease ran out during 1 of 1 attempt(s): {stale.event_id}#1" in caplog.text
    [event] = events(app)
    assert (event.status, event.attempts, event.last_error) == ("pending", 2, "answered 500")
    assert sorted((a.number, a.outcome) for a in attempts(app, event.id)) == [
        (1, "delivered"), (2, "failed")]
