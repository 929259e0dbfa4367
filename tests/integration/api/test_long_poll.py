"""?wait=N: held until the elicitation ends, woken across instances, never starving others."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from gateway import db
from gateway.app import create_app
from gateway.elicitations.waiting import WaitHub
from gateway.settings import Settings
from tests.conftest import Api, client_for
from tests.integration.api.test_create import body


@pytest.fixture
def other_instance(settings: Settings) -> Iterator[Flask]:
    """A second gateway instance on the same database: its own engine, its own process state."""
    second = create_app(settings)
    yield second
    db.engine_of(second).dispose()


class Waiter(threading.Thread):
    """A client long-polling in the background."""

    def __init__(self, api: Api, path: str) -> None:
        super().__init__(daemon=True)
        self.api, self.path = api, path
        self.result: dict[str, Any] | None = None
        self.elapsed = 0.0

    def run(self) -> None:
        started = time.monotonic()
        self.result = self.api.get(self.path).get_json()
        self.elapsed = time.monotonic() - started


def test_a_change_on_another_instance_wakes_the_waiter(api: Api, other_instance: Flask) -> None:
    created = api.post("/api/v1/elicitations", body()).get_json()
    waiter = Waiter(api, f"/api/v1/elicitations/{created['id']}?wait=30")
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive(), "the wait returned before anything happened"
    elsewhere = Api(client_for(other_instance), api.token)
    assert elsewhere.post(f"/api/v1/elicitations/{created['id']}/cancel").status_code == 200
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert waiter.result is not None
    assert waiter.result["status"] == "cancelled"
    # Woken by the signal, not by the fallback poll or the 30 s limit.
    assert waiter.elapsed < 1.5


def test_a_wait_with_nothing_happening_returns_when_its_time_is_up(api: Api) -> None:
    created = api.post("/api/v1/elicitations", body()).get_json()
    started = time.monotonic()
    read = api.get(f"/api/v1/elicitations/{created['id']}?wait=1").get_json()
    assert read["status"] == "pending"
    assert 0.9 <= time.monotonic() - started < 5


def test_an_ended_elicitation_answers_at_once(api: Api) -> None:
    created = api.post("/api/v1/elicitations", body()).get_json()
    api.post(f"/api/v1/elicitations/{created['id']}/cancel")
    started = time.monotonic()
    read = api.get(f"/api/v1/elicitations/{created['id']}?wait=30").get_json()
    assert read["status"] == "cancelled"
    assert time.monotonic() - started < 1


def test_waiters_beyond_the_slots_are_answered_at_once(app: Flask) -> None:
    hub = WaitHub(db.engine_of(app), app.extensions["gateway.clock"], slots=1)
    holder = threading.Thread(target=hub.wait, args=("el_held", 1.5), daemon=True)
    holder.start()
    time.sleep(0.2)
    started = time.monotonic()
    assert hub.wait("el_other", 10) is False
    assert time.monotonic() - started < 0.5
    holder.join()
