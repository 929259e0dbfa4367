"""A running dispatcher keeps signing webhooks through a key rotation, without a restart."""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask
from sqlalchemy import select
from standardwebhooks import Webhook

from gateway import db
from gateway.clients.models import WebhookSecret
from gateway.webhooks.dispatcher import Dispatcher
from tests.conftest import Api, Registered
from tests.integration.conftest import Result
from tests.integration.webhooks.conftest import Receiver, end_one


def ok(result: Result) -> str:
    assert result.code == 0, result.stderr
    return result.stdout


def secret_versions(app: Flask) -> set[int]:
    with app.app_context():
        return set(db.session().scalars(select(WebhookSecret.key_version)))


def test_the_dispatcher_opens_webhook_secrets_rewrapped_while_it_runs(
    app: Flask, hooked: Registered, hooked_api: Api, receiver: Receiver,
    make_dispatcher: Callable[..., Dispatcher], invoke_gateway: Callable[..., Result],
) -> None:
    dispatcher = make_dispatcher()  # started before the rotation, as a running worker is
    end_one(hooked_api)
    assert dispatcher.run_once() == 1  # it holds v1 from here on

    ok(invoke_gateway("keys", "rotate"))
    ok(invoke_gateway("keys", "rewrap"))
    assert secret_versions(app) == {2}
    end_one(hooked_api)
    assert dispatcher.run_once() == 1

    ok(invoke_gateway("keys", "retire", "v1"))
    end_one(hooked_api)
    assert dispatcher.run_once() == 1

    deliveries = receiver.wait_for(3)
    assert len(deliveries) == 3
    for delivery in deliveries:
        Webhook(hooked.webhook_secret).verify(delivery.body, delivery.headers)
