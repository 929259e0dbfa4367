"""Every way a credential is revoked sends its MCP server ``credential.revoked``, with why.

By its user on /account, by the MCP server through the API, by the operator
with the command line, and by the user storing a new key in its place (the
provider refusing a refresh is the fifth, in tests/integration/oauth).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select

from gateway import db
from gateway.audit.models import AuditEvent
from gateway.settings import Settings
from gateway.webhooks.models import WebhookEvent
from tests.conftest import Api, Registered, client_for
from tests.integration.conftest import Result
from tests.integration.portal.conftest import Browser

WEBHOOK_URL = "https://mcp.example.com/hooks"


@pytest.fixture
def api(app: Flask, register: Callable[..., Registered]) -> Api:
    """The MCP server, with a webhook endpoint to hear of revocations."""
    return Api(client_for(app), register(webhook_url=WEBHOOK_URL).api_token)


@pytest.fixture
def store_key(browser: Callable[[], Browser], make_user: Callable[..., str],
              link_for: Callable[..., dict[str, Any]], api: Api) -> Callable[[str], str]:
    """Alice stores a key on the portal; the id of the credential it became."""
    make_user("alice")
    alice = browser()
    alice.log_in("alice")

    def store(secret: str) -> str:
        link = link_for("alice")
        answered = alice.post_form(f"/e/{link['id']}", {"action": "submit", "secret": secret})
        assert answered.status_code == 200, answered.get_data(as_text=True)
        [credential] = api.get("/api/v1/credentials").get_json()["items"]
        credential_id: str = credential["id"]
        return credential_id

    return store


def revocations(app: Flask) -> list[dict[str, Any]]:
    """The ``data`` of every ``credential.revoked`` event in the outbox."""
    with app.app_context():
        bodies = db.session().scalars(select(WebhookEvent.body).where(
            WebhookEvent.type == "credential.revoked"))
        return [json.loads(body)["data"] for body in bodies]


def test_each_revocation_sends_credential_revoked_with_its_reason(
    app: Flask, api: Api, settings: Settings, browser: Callable[[], Browser],
    store_key: Callable[[str], str], invoke_gateway: Callable[..., Result],
) -> None:
    by_user = store_key("wx-live-by-the-user-0001")
    alice = browser()
    alice.log_in("alice")
    answer = alice.post_form(f"/account/credentials/{by_user}/revoke", {}, page="/account")
    assert answer.status_code == 303

    by_client = store_key("wx-live-by-the-client-02")
    answer = api.client.delete(f"/api/v1/credentials/{by_client}", headers=api.headers())
    assert answer.status_code == 200

    by_operator = store_key("wx-live-by-the-operator3")
    result = invoke_gateway("credentials", "revoke", by_operator)
    assert result.code == 0, result.stderr
    assert result.stdout == f"credential {by_operator} revoked\n"  # an API key: no provider

    superseded = store_key("wx-live-to-be-replaced-4")
    store_key("wx-live-the-replacement-5")

    # The command line stamps by the real clock, the app by the test's: compared by credential.
    expected = {by_user: "user", by_client: "client", by_operator: "operator",
                superseded: "superseded"}
    subject = {"iss": settings.public_url, "sub": "alice"}
    assert {event["credential_id"]: event for event in revocations(app)} == {
        credential_id: {"credential_id": credential_id, "type": "generic", "subject": subject,
                        "reason": reason}
        for credential_id, reason in expected.items()}
    with app.app_context():
        audited = db.session().execute(select(AuditEvent.target, AuditEvent.details).where(
            AuditEvent.action == "credential.revoked")).all()
    assert {target: details["reason"] for target, details in audited} == expected
    # An API key has no provider to tell: its audit rows say nothing of one.
    assert not any("provider_revocation" in details for _, details in audited)
