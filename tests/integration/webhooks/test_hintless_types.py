"""A type with ``hint = false``: no tail of its keys is kept, shown or sent anywhere."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import select

from gateway import db
from gateway.clock import SystemClock
from gateway.credentials.models import Credential
from gateway.identity import service as identity
from gateway.webhooks.dispatcher import Dispatcher
from tests.conftest import Api, client_for
from tests.integration.api.test_create import body
from tests.integration.portal.conftest import PASSWORD, Browser
from tests.integration.webhooks.conftest import Receiver

KEY = "vt-live-3c9e0d7f5a1b2468"
TAIL = KEY[-4:]
ALICE = {"iss": "https://gateway.test", "sub": "alice"}


@pytest.fixture
def base_environ(base_environ: dict[str, str], tmp_path: Path) -> dict[str, str]:
    catalog = tmp_path / "credential_types.toml"
    catalog.write_text('[generic]\nlabel = "API key"\n\n'
                       '[vault-token]\nlabel = "Vault token"\nhint = false\n')
    return {**base_environ, "GATEWAY_CREDENTIAL_TYPES_FILE": str(catalog)}


@pytest.fixture
def alice(app: Flask) -> Browser:
    with app.app_context(), db.transaction() as session:
        identity.create_user(session, SystemClock(), username="alice", password=PASSWORD,
                             actor="test")
    browser = Browser(client_for(app))
    browser.log_in("alice")
    return browser


def capture(api: Api, alice: Browser, credential_type: str) -> None:
    link = api.post("/api/v1/elicitations", body(subject=ALICE, reuse_pending=False,
                                                  credential_type=credential_type)).get_json()
    done = alice.post_form(f"/e/{link['id']}", {"action": "submit", "secret": KEY})
    assert done.status_code == 200, done.get_data(as_text=True)


def test_a_hintless_key_is_sent_listed_and_shown_without_its_tail(
    app: Flask, hooked_api: Api, alice: Browser, receiver: Receiver,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    capture(hooked_api, alice, "vault-token")
    make_dispatcher().run_once()
    [delivery] = receiver.deliveries
    credential = json.loads(delivery.body)["data"]["credential"]
    assert credential["type"] == "vault-token"
    assert credential["hint"] is None
    assert TAIL.encode() not in delivery.body
    [listed] = hooked_api.get("/api/v1/credentials?type=vault-token").get_json()["items"]
    assert listed["hint"] is None
    page = alice.get("/account").get_data(as_text=True)
    assert "Vault token" in page
    assert TAIL not in page
    with app.app_context():
        [stored] = db.session().scalars(select(Credential.hint))
    assert stored is None


def test_a_type_with_hints_still_sends_and_shows_the_tail(
    hooked_api: Api, alice: Browser, receiver: Receiver,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    capture(hooked_api, alice, "generic")
    make_dispatcher().run_once()
    [delivery] = receiver.deliveries
    assert json.loads(delivery.body)["data"]["credential"]["hint"] == f"…{TAIL}"
    [listed] = hooked_api.get("/api/v1/credentials?type=generic").get_json()["items"]
    assert listed["hint"] == f"…{TAIL}"
    assert f"…{TAIL}" in alice.get("/account").get_data(as_text=True)
