"""An idle dispatcher is woken by the commit of an event, not by its next poll."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy.exc import OperationalError

from gateway.webhooks import dispatcher as dispatcher_module
from gateway.webhooks.dispatcher import Dispatcher
from tests.conftest import Api
from tests.integration.webhooks.conftest import Receiver, end_one, events

# Far longer than any delivery may take here: only the change signal can wake
# the dispatcher in time, a poll cannot.
IDLE_POLL_SECONDS = 30.0
PROMPT_SECONDS = 0.5


@pytest.fixture
def running(
    hooked_api: Api, make_dispatcher: Callable[..., Dispatcher], monkeypatch: pytest.MonkeyPatch,
) -> Iterator[threading.Thread]:
    """A dispatcher in run(), idle, that would poll only every 30 s."""
    monkeypatch.setattr(dispatcher_module, "IDLE_WAIT_SECONDS", IDLE_POLL_SECONDS)
    stop = threading.Event()
    thread = threading.Thread(target=make_dispatcher().run, args=(stop,), daemon=True)
    thread.start()
    time.sleep(0.5)  # listening, nothing due: asleep on the change signal
    yield thread
    stop.set()
    end_one(hooked_api)  # wakes it once more, to see the stop
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_a_committed_event_is_delivered_at_once_by_an_idle_dispatcher(
    app: Flask, hooked_api: Api, receiver: Receiver, running: threading.Thread,
) -> None:
    for count in range(1, 4):
        time.sleep(0.3)  # commits at different points of any poll cycle
        began = time.monotonic()  # before the request that commits: an upper bound
        end_one(hooked_api)
        [*_, delivery] = receiver.wait_for(count, timeout=5)
        assert len(receiver.deliveries) == count
        assert delivery.arrived_at - began < PROMPT_SECONDS
    deadline = time.monotonic() + 5
    while {e.status for e in events(app)} != {"delivered"} and time.monotonic() < deadline:
        time.sleep(0.05)  # the outcome is written just after the receiver answers
    assert {e.status for e in events(app)} == {"delivered"}


def test_a_dispatcher_keeps_going_after_a_database_error(
    app: Flask, hooked_api: Api, receiver: Receiver, make_dispatcher: Callable[..., Dispatcher],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    dispatcher = make_dispatcher()
    real_claim = dispatcher._claim_jobs
    failures = iter([OperationalError("SELECT", {}, Exception("server closed the connection"))])

    def flaky_claim(limit: int) -> Any:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real_claim(limit)

    monkeypatch.setattr(dispatcher, "_claim_jobs", flaky_claim)
    end_one(hooked_api)
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="gateway.webhooks.dispatcher"):
        thread = threading.Thread(target=dispatcher.run, args=(stop,), daemon=True)
        thread.start()
        try:
            assert len(receiver.wait_for(1, timeout=10)) == 1
        finally:
            stop.set()
            thread.join(timeout=10)
    assert not thread.is_alive()
    assert "dispatching webhooks failed (OperationalError); trying again" in caplog.text
