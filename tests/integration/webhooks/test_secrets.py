"""One client's signing secret that does not open stops that client's webhooks, no one else's."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest
from flask import Flask
from sqlalchemy import select

from gateway import db
from gateway.client import verify_webhook
from gateway.clients.models import WebhookSecret
from gateway.clock import FixedClock
from gateway.webhooks.dispatcher import CANNOT_SIGN, SCHEDULE, Dispatcher
from tests.conftest import Api, Registered, client_for
from tests.integration.conftest import Result
from tests.integration.log_canary import tell_tales
from tests.integration.webhooks.conftest import Receiver, attempts, end_one, events


@pytest.fixture
def broken(app: Flask, register: Callable[..., Registered], receiver: Receiver) -> Registered:
    """A client whose stored signing secret has one flipped byte: it no longer opens."""
    registered = register("broken-secret", webhook_url=receiver.url)
    with app.app_context(), db.transaction() as session:
        row = session.scalars(select(WebhookSecret).where(
            WebhookSecret.client_id == registered.id)).one()
        row.ciphertext = bytes([row.ciphertext[0] ^ 0x01]) + row.ciphertext[1:]
    return registered


def test_a_secret_that_does_not_open_fails_only_its_clients_events(
    app: Flask, hooked: Registered, hooked_api: Api, broken: Registered, receiver: Receiver,
    clock: FixedClock, make_dispatcher: Callable[..., Dispatcher],
    caplog: pytest.LogCaptureFixture,
) -> None:
    end_one(Api(client_for(app), broken.api_token))
    end_one(hooked_api)
    dispatcher = make_dispatcher()

    with caplog.at_level(logging.INFO, logger="gateway.webhooks"):
        assert dispatcher.run_once() == 2
    by_client = {event.client_id: event for event in events(app)}
    healthy, failing = by_client[hooked.id], by_client[broken.id]
    assert healthy.status == "delivered"
    [delivery] = receiver.deliveries
    assert delivery.headers["webhook-id"] == healthy.id
    verify_webhook(hooked.webhook_secret, delivery.headers, delivery.body)
    assert (failing.status, failing.attempts, failing.last_error) == ("pending", 1, CANNOT_SIGN)
    assert [(a.number, a.outcome, a.status_code, a.error) for a in attempts(app, failing.id)] \
        == [(1, "failed", None, CANNOT_SIGN)]
    assert f"client {broken.id}: {CANNOT_SIGN}" in caplog.text
    for tale in [*tell_tales(hooked.webhook_secret), *tell_tales(broken.webhook_secret)]:
        assert tale not in caplog.text

    # Like any failed attempt: not before the schedule says, then once per step.
    assert dispatcher.run_once() == 0
    for attempt in range(2, len(SCHEDULE) + 1):
        clock.advance(seconds=SCHEDULE[attempt - 1].total_seconds() * 1.21)
        assert dispatcher.run_once() == 1, f"attempt {attempt} was not due"
    [failing] = [event for event in events(app) if event.client_id == broken.id]
    assert (failing.status, failing.attempts, failing.last_error) == (
        "dead", len(SCHEDULE), CANNOT_SIGN)
    assert len(attempts(app, failing.id)) == len(SCHEDULE)
    assert len(receiver.deliveries) == 1  # nothing unsigned ever left


def test_status_names_the_client_whose_secret_does_not_open(
    app: Flask, hooked: Registered, broken: Registered, hooked_api: Api,
    make_dispatcher: Callable[..., Dispatcher], invoke_gateway: Callable[..., Result],
) -> None:
    end_one(Api(client_for(app), broken.api_token))
    end_one(hooked_api)
    make_dispatcher().run_once()

    result = invoke_gateway("status", "--json")
    assert result.code == 1
    hooks = json.loads(result.stdout)["webhooks"]
    assert hooks["unsigned_clients"] == [broken.id]
    assert hooks["failing_unsigned"] == 1
    text = invoke_gateway("status")
    assert text.code == 1
    assert f"{CANNOT_SIGN}; clients {broken.id}, 1 event(s) failing" in text.stdout
    for tale in tell_tales(hooked.webhook_secret):
        assert tale not in result.stdout + text.stdout


def test_a_test_ping_says_the_secret_does_not_open(
    broken: Registered, receiver: Receiver, invoke_gateway: Callable[..., Result],
) -> None:
    result = invoke_gateway("webhooks", "test", broken.id)
    assert result.code == 1
    assert f"client {broken.id}: {CANNOT_SIGN}" in result.stderr
    assert receiver.deliveries == []
