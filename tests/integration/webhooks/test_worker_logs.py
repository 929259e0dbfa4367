"""The canary for ``gateway worker``: it signs with the client's webhook secret and reports
a stored key, at debug level in either log format, and its log names the event but holds
none of those secrets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from standardwebhooks import Webhook

from gateway import db
from gateway.clock import SystemClock
from gateway.identity import service as identity
from tests.conftest import TEST_KEYRING, Api, Registered, client_for
from tests.integration.conftest import Result
from tests.integration.log_canary import assert_nowhere, records, tell_tales
from tests.integration.portal.conftest import PASSWORD, Browser
from tests.integration.webhooks.conftest import Receiver

pytestmark = pytest.mark.slow

CANARY_KEY = "sk-canary-worker-3e8a1c6f9b2d"


def complete_with_key(app: Flask, hooked_api: Api, secret: str) -> str:
    """A user enters ``secret`` for the hooked client, which queues its webhook; the
    elicitation's id."""
    with app.app_context(), db.transaction() as session:
        identity.create_user(session, SystemClock(), username="alice", password=PASSWORD,
                             actor="test")
    settings = app.extensions["gateway.settings"]
    link = hooked_api.post("/api/v1/elicitations", {
        "subject": {"iss": settings.public_url, "sub": "alice"}, "kind": "api_key",
        "credential_type": "generic", "message": "Your key, please"}).get_json()
    alice = Browser(client_for(app))
    alice.log_in("alice")
    assert alice.post_form(f"/e/{link['id']}", {"action": "submit", "secret": secret}) \
        .status_code == 200
    elicitation_id: str = link["id"]
    return elicitation_id


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_the_worker_log_names_the_event_and_holds_no_secret(
    app: Flask, hooked: Registered, hooked_api: Api, receiver: Receiver,
    run_gateway: Callable[..., Result], cli_environ: dict[str, str], log_format: str,
) -> None:
    complete_with_key(app, hooked_api, CANARY_KEY)
    result = run_gateway("worker", "--once", env={
        **cli_environ, "GATEWAY_LOG_LEVEL": "debug", "GATEWAY_LOG_FORMAT": log_format})
    assert result.code == 0, result.stderr

    [delivery] = receiver.deliveries
    payload: dict[str, Any] = Webhook(hooked.webhook_secret).verify(delivery.body,
                                                                     delivery.headers)
    assert payload["data"]["status"] == "completed"
    event_id = delivery.headers["webhook-id"]
    lines = records(result.stderr, log_format)
    assert any(line["level"] == "debug" for line in lines)
    if log_format == "json":
        [delivered] = [line for line in lines if line.get("event_id") == event_id]
        assert (delivered["logger"], delivered["outcome"], delivered["attempt"],
                delivered["status_code"]) == ("gateway.webhooks.dispatcher", "delivered", 1, 204)
    else:
        assert any(f"webhook {event_id} delivered on attempt 1 (HTTP 204" in line["line"]
                   for line in lines)

    keyring_key = TEST_KEYRING.split(":", 1)[1]
    assert_nowhere([*tell_tales(hooked.webhook_secret), *tell_tales(hooked.api_token),
                    CANARY_KEY, CANARY_KEY[:-4], keyring_key, keyring_key[:16],
                    delivery.headers["webhook-signature"].split(",", 1)[1]],
                   stdout=result.stdout, log=result.stderr)
