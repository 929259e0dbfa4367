"""A worker that stopped looking for due events shows in /readyz and in ``gateway status``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from gateway import db
from gateway.clock import FixedClock
from gateway.webhooks.dispatcher import LEASE, Dispatcher
from gateway.webhooks.models import WorkerHeartbeat
from tests.conftest import Api
from tests.integration.conftest import Result
from tests.integration.webhooks.conftest import end_one, events

READY = {"status": "ready", "database": "ok", "migrations": "current"}


def heartbeats(app: Flask) -> list[WorkerHeartbeat]:
    with app.app_context():
        return list(db.session().scalars(select(WorkerHeartbeat)))


def test_readyz_fails_once_events_are_overdue_and_no_worker_has_looked_for_a_lease(
    app: Flask, client: FlaskClient, hooked_api: Api, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    dispatcher = make_dispatcher()
    assert dispatcher.run_once() == 0  # a worker looks: nothing is due
    [beat] = heartbeats(app)
    assert (beat.id, beat.polled_at) == (dispatcher.worker_id, clock.now())

    # The worker dies; an event falls due. Within a lease, a worker may
    # still be about to look: ready.
    end_one(hooked_api)
    clock.advance(seconds=LEASE.total_seconds())
    response = client.get("/readyz")
    assert (response.status_code, response.get_json()) == (200, READY)

    clock.advance(seconds=1)
    response = client.get("/readyz")
    assert response.status_code == 503
    answer = response.get_json()
    assert {k: answer[k] for k in ("status", "database", "migrations", "webhooks")} == {
        "status": "unavailable", "database": "ok", "migrations": "current",
        "webhooks": "stalled"}
    assert "no worker has looked for them since" in answer["reason"]

    # A worker looks again (another one, or the same one restarted): ready.
    assert make_dispatcher().run_once() == 1
    assert client.get("/readyz").get_json() == READY
    assert events(app)[0].status == "delivered"


def test_with_no_worker_readyz_is_ready_until_an_event_is_overdue(
    client: FlaskClient, hooked_api: Api, clock: FixedClock,
) -> None:
    # `gateway serve --no-worker` with its workers elsewhere: nothing is due, nothing to say.
    assert client.get("/readyz").get_json() == READY
    end_one(hooked_api)
    clock.advance(seconds=LEASE.total_seconds() + 1)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert "no worker has looked for them at all" in response.get_json()["reason"]


def test_a_worker_that_looked_within_a_lease_keeps_readyz_ready(
    app: Flask, client: FlaskClient, hooked_api: Api, clock: FixedClock,
) -> None:
    end_one(hooked_api)
    clock.advance(seconds=LEASE.total_seconds() * 3)
    # The event is long overdue, but a worker looked a moment ago (every
    # thread of it busy sending, say): it is alive.
    with app.app_context(), db.transaction() as session:
        session.add(WorkerHeartbeat(id="busy", started_at=clock.now(), polled_at=clock.now()))
    assert client.get("/readyz").get_json() == READY


def test_a_worker_that_stops_takes_its_heartbeat_away(
    app: Flask, make_dispatcher: Callable[..., Dispatcher],
) -> None:
    stop = threading.Event()
    dispatcher = make_dispatcher()
    running = threading.Thread(target=dispatcher.run, args=(stop,))
    running.start()
    try:
        deadline = time.monotonic() + 10
        while not heartbeats(app) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [beat.id for beat in heartbeats(app)] == [dispatcher.worker_id]
    finally:
        stop.set()
        running.join(timeout=10)
    assert heartbeats(app) == []


def test_heartbeats_are_written_a_few_times_per_lease_and_old_ones_pruned(
    app: Flask, clock: FixedClock, make_dispatcher: Callable[..., Dispatcher],
) -> None:
    gone = make_dispatcher()
    gone.run_once()
    clock.advance(days=2)
    dispatcher = make_dispatcher()
    dispatcher.run_once()
    [beat] = heartbeats(app)  # the one of a worker gone two days is deleted
    assert beat.id == dispatcher.worker_id
    clock.advance(seconds=LEASE.total_seconds() / 3 - 1)
    dispatcher.run_once()
    assert heartbeats(app)[0].polled_at == beat.polled_at  # not worth a write yet
    clock.advance(seconds=1)
    dispatcher.run_once()
    assert heartbeats(app)[0].polled_at == clock.now()


def test_status_reports_a_stalled_worker(
    app: Flask, hooked_api: Api, clock: FixedClock, invoke_gateway: Callable[..., Result],
) -> None:
    # `gateway status` reads the system clock: the event is made overdue by
    # the app's clock running a lease and more behind it.
    clock.advance(seconds=-(LEASE.total_seconds() + 60))
    end_one(hooked_api)
    result = invoke_gateway("status", "--json")
    assert result.code == 1
    hooks = json.loads(result.stdout)["webhooks"]
    assert hooks["worker_last_poll"] is None
    assert "no worker has looked for them at all" in hooks["stalled"]
    text = invoke_gateway("status")
    assert "worker:" in text.stdout
    assert "is `gateway worker` running?" in text.stdout
