"""Webhooks: written with the change, signed as Standard Webhooks say, delivered once."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

import pytest
from flask import Flask
from sqlalchemy import func, select
from standardwebhooks import Webhook, WebhookVerificationError

from gateway import db
from gateway.client import verify_webhook
from gateway.clients import service as clients
from gateway.clients.models import WebhookSecret
from gateway.clock import FixedClock, SystemClock
from gateway.elicitations import lifecycle
from gateway.elicitations.lifecycle import Status
from gateway.elicitations.models import Elicitation
from gateway.identity import service as identity
from gateway.vault.keyring import load_keyring
from gateway.webhooks import service
from gateway.webhooks.dispatcher import SCHEDULE, Dispatcher
from gateway.webhooks.models import WebhookEvent
from tests.conftest import Api, Registered, client_for
from tests.integration.api.test_create import body
from tests.integration.portal.conftest import PASSWORD, Browser
from tests.integration.webhooks.conftest import Receiver


def events(app: Flask) -> list[WebhookEvent]:
    with app.app_context():
        return list(db.session().scalars(select(WebhookEvent)))


def test_a_cancellation_reaches_the_receiver_verifiably(
    app: Flask, hooked: Registered, hooked_api: Api, receiver: Receiver,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    created = hooked_api.post("/api/v1/elicitations", body(metadata={"tool": "x"})).get_json()
    assert events(app) == []  # creating reports nothing; ending does
    hooked_api.post(f"/api/v1/elicitations/{created['id']}/cancel")
    [event] = events(app)
    assert make_dispatcher().run_once() == 1
    [delivery] = receiver.deliveries
    # Verified by the reference implementation, written outside this project.
    payload = Webhook(hooked.webhook_secret).verify(delivery.body, delivery.headers)
    assert payload["type"] == "elicitation.cancelled"
    assert payload["data"] == {
        "elicitation_id": created["id"], "status": "cancelled", "kind": "api_key",
        "subject": created["subject"], "metadata": {"tool": "x"}}
    assert delivery.headers["webhook-id"] == event.id
    # And by the gateway's own helper for MCP servers.
    assert verify_webhook(hooked.webhook_secret, delivery.headers, delivery.body) == payload
    assert events(app)[0].status == "delivered"


def test_nothing_secret_is_in_a_completion_event(
    app: Flask, hooked: Registered, hooked_api: Api, receiver: Receiver,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    with app.app_context(), db.transaction() as session:
        identity.create_user(session, SystemClock(), username="alice", password=PASSWORD,
                             actor="test")
    link = hooked_api.post("/api/v1/elicitations", body(
        subject={"iss": "https://gateway.test", "sub": "alice"})).get_json()
    alice = Browser(client_for(app))
    alice.log_in("alice")
    alice.post_form(f"/e/{link['id']}", {"action": "submit", "secret": "sk-canary-5e6f7a8b"})
    make_dispatcher().run_once()
    [delivery] = receiver.deliveries
    assert b"sk-canary-5e6f7a8b" not in delivery.body
    data = json.loads(delivery.body)["data"]
    assert data["status"] == "completed"
    assert data["credential"]["type"] == "generic"
    assert data["credential"]["hint"] == "…7a8b"


def test_a_rolled_back_change_leaves_no_event(app: Flask, hooked_api: Api) -> None:
    created = hooked_api.post("/api/v1/elicitations", body()).get_json()
    with app.app_context():
        session = db.session()
        elicitation = session.get(Elicitation, created["id"])
        assert elicitation is not None
        lifecycle.transition(session, app.extensions["gateway.clock"], elicitation,
                             Status.CANCELLED, actor="test")
        session.rollback()
    assert events(app) == []
    assert hooked_api.get(f"/api/v1/elicitations/{created['id']}").get_json()["status"] \
        == "pending"


def test_a_client_without_webhook_url_gets_no_event(app: Flask, api: Api) -> None:
    created = api.post("/api/v1/elicitations", body()).get_json()
    api.post(f"/api/v1/elicitations/{created['id']}/cancel")
    assert events(app) == []


def test_failures_are_retried_on_schedule_with_the_same_id(
    app: Flask, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    receiver.script = [500, 302, 503]
    created = hooked_api.post("/api/v1/elicitations", body()).get_json()
    hooked_api.post(f"/api/v1/elicitations/{created['id']}/cancel")
    dispatcher = make_dispatcher()
    assert dispatcher.run_once() == 1
    assert dispatcher.run_once() == 0  # not due yet
    for attempt in range(2, 5):
        clock.advance(seconds=SCHEDULE[attempt - 1].total_seconds() * 1.21)
        assert dispatcher.run_once() == 1, f"attempt {attempt} was not due"
    ids = {d.headers["webhook-id"] for d in receiver.deliveries}
    assert len(receiver.deliveries) == 4
    assert len(ids) == 1
    stamps = [d.headers["webhook-timestamp"] for d in receiver.deliveries]
    assert len(set(stamps)) == 4  # signed afresh on every attempt
    [event] = events(app)
    assert (event.status, event.attempts) == ("delivered", 4)


def test_after_the_last_attempt_the_event_is_dead_and_can_be_redelivered(
    app: Flask, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    receiver.script = [500] * len(SCHEDULE)
    created = hooked_api.post("/api/v1/elicitations", body()).get_json()
    hooked_api.post(f"/api/v1/elicitations/{created['id']}/cancel")
    dispatcher = make_dispatcher()
    for _ in SCHEDULE:
        clock.advance(hours=13)
        dispatcher.run_once()
    [event] = events(app)
    assert (event.status, event.attempts) == ("dead", len(SCHEDULE))
    with app.app_context(), db.transaction() as session:
        service.redeliver(session, clock, event.id, actor="test")
    assert dispatcher.run_once() == 1
    assert events(app)[0].status == "delivered"
    assert receiver.deliveries[-1].headers["webhook-id"] == event.id


def test_during_a_secret_rotation_both_secrets_verify(
    app: Flask, hooked: Registered, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    with app.app_context(), db.transaction() as session:
        new_secret = clients.rotate_webhook_secret(
            session, clock, keyring=load_keyring(app.extensions["gateway.settings"]),
            client_ref=hooked.id, grace=timedelta(hours=24), actor="test")
    created = hooked_api.post("/api/v1/elicitations", body()).get_json()
    hooked_api.post(f"/api/v1/elicitations/{created['id']}/cancel")
    make_dispatcher().run_once()
    delivery = receiver.deliveries[-1]
    assert len(delivery.headers["webhook-signature"].split()) == 2
    for secret in (hooked.webhook_secret, new_secret):
        Webhook(secret).verify(delivery.body, delivery.headers)

    # The grace runs out (moved into the past rather than waiting a day, so
    # the receiver's own clock still accepts the timestamps).
    with app.app_context(), db.transaction() as session:
        for row in session.scalars(select(WebhookSecret).where(
                WebhookSecret.retires_at.is_not(None))):
            row.retires_at = clock.now() - timedelta(seconds=1)
    second = hooked_api.post("/api/v1/elicitations", body(reuse_pending=False)).get_json()
    hooked_api.post(f"/api/v1/elicitations/{second['id']}/cancel")
    make_dispatcher().run_once()
    late = receiver.deliveries[-1]
    assert len(late.headers["webhook-signature"].split()) == 1
    Webhook(new_secret).verify(late.body, late.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(hooked.webhook_secret).verify(late.body, late.headers)


def test_an_event_is_claimed_by_one_dispatcher_at_a_time(
    app: Flask, hooked_api: Api, make_dispatcher: Callable[..., Dispatcher],
) -> None:
    created = hooked_api.post("/api/v1/elicitations", body()).get_json()
    hooked_api.post(f"/api/v1/elicitations/{created['id']}/cancel")
    first, second = make_dispatcher(), make_dispatcher()
    assert len(first.claim(10)) == 1
    assert second.claim(10) == []
    with app.app_context():
        count = db.session().scalar(select(func.count()).select_from(WebhookEvent))
    assert count == 1
