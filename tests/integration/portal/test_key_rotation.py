"""Key rotation while the gateway serves: `gateway keys rotate`, `rewrap` and `retire` run
beside running apps, and no reveal fails, with no restart, on one instance or two."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select

from gateway import db
from gateway.app import create_app
from gateway.clients import service as clients
from gateway.clients.models import Client, WebhookSecret
from gateway.clients.service import current_webhook_secrets
from gateway.clock import FixedClock
from gateway.credentials import service as credentials
from gateway.credentials.catalog import current_catalog
from gateway.credentials.models import Credential
from gateway.elicitations import views
from gateway.elicitations.models import Elicitation
from gateway.identity.sessions import Subject
from gateway.outbound import OutboundPolicy
from gateway.settings import Settings
from gateway.vault import versions
from gateway.vault.keyring import current_keyring
from gateway.vault.models import VaultInstance
from gateway.vault.sealing import store_sealed
from tests.conftest import Api, client_for
from tests.integration.conftest import Result
from tests.integration.portal.conftest import Browser

Capture = Callable[[str, str], str]


def ok(result: Result) -> str:
    assert result.code == 0, result.stderr
    return result.stdout


@pytest.fixture
def capture(app: Flask, link_for: Callable[..., dict[str, Any]],
            make_user: Callable[..., str]) -> Capture:
    """A new user enters ``secret`` on the portal of ``app``; the id of the stored credential."""

    def enter(username: str, secret: str) -> str:
        make_user(username)
        link = link_for(username)
        user = Browser(client_for(app))
        user.log_in(username)
        answered = user.post_form(f"/e/{link['id']}", {"action": "submit", "secret": secret})
        assert answered.status_code == 200, answered.get_data(as_text=True)
        credential = sealed_for(app, link["id"])
        return credential.id

    return enter


def sealed_for(app: Flask, elicitation_id: str) -> Credential:
    with app.app_context():
        found = db.session().scalar(select(Credential).where(
            Credential.elicitation_id == elicitation_id))
    assert found is not None
    return found


def key_version(app: Flask, credential_id: str) -> int:
    with app.app_context():
        found = db.session().get(Credential, credential_id)
        assert found is not None
        return found.key_version


def failed_reveals(apis: list[Api], stored: dict[str, str]) -> list[str]:
    """Reveal every stored secret through every app; what did not answer 200 with the secret."""
    failed = []
    for api in apis:
        for credential_id, secret in stored.items():
            answer = api.post(f"/api/v1/credentials/{credential_id}/reveal")
            if answer.status_code != 200 or answer.get_json()["secret"] != secret:
                failed.append(f"{credential_id}: {answer.status_code} "
                              f"{answer.get_data(as_text=True)[:200]}")
    return failed


@pytest.fixture
def other_app(settings: Settings, clock: FixedClock) -> Iterator[Flask]:
    """A second instance on the same database and keyring, as behind a load balancer."""
    application = create_app(settings, clock=FixedClock(clock.now()))
    application.config["TESTING"] = True
    yield application
    application.extensions["gateway.engine"].dispose()


def test_reveals_keep_opening_through_rotate_rewrap_and_retire_without_a_restart(
    app: Flask, api: Api, capture: Capture, clock: FixedClock,
    invoke_gateway: Callable[..., Result],
) -> None:
    stored = {capture("alice", "sk-before-rotation"): "sk-before-rotation"}
    assert failed_reveals([api], stored) == []

    ok(invoke_gateway("keys", "rotate"))
    assert failed_reveals([api], stored) == []
    # The app reads the versions again within REFRESH; until then it wraps with v1.
    during = capture("bob", "sk-during-rotation")
    stored[during] = "sk-during-rotation"
    assert key_version(app, during) == 1

    ok(invoke_gateway("keys", "rewrap"))
    assert {key_version(app, c) for c in stored} == {2}
    assert failed_reveals([api], stored) == []  # the same app object, never restarted

    clock.advance(seconds=versions.REFRESH.total_seconds())
    after = capture("carol", "sk-after-rotation")
    stored[after] = "sk-after-rotation"
    assert key_version(app, after) == 2

    ok(invoke_gateway("keys", "retire", "v1"))
    assert failed_reveals([api], stored) == []


def test_two_instances_open_what_the_other_and_the_command_line_sealed(
    app: Flask, other_app: Flask, api: Api, capture: Capture, clock: FixedClock,
    invoke_gateway: Callable[..., Result],
) -> None:
    apis = [api, Api(client_for(other_app), api.token)]
    stored = {capture("alice", "sk-one"): "sk-one"}
    assert failed_reveals(apis, stored) == []

    ok(invoke_gateway("keys", "rotate"))
    clock.advance(seconds=versions.REFRESH.total_seconds())  # the first app moves to v2
    newer = capture("bob", "sk-two")
    stored[newer] = "sk-two"
    assert key_version(app, newer) == 2
    # The other instance never saw v2 before: it reads the versions again to open it.
    assert failed_reveals(apis, stored) == []

    ok(invoke_gateway("keys", "rewrap"))
    assert failed_reveals(apis, stored) == []
    ok(invoke_gateway("keys", "retire", "v1"))
    assert failed_reveals(apis, stored) == []


def test_a_key_whose_version_is_retired_before_it_is_stored_is_sealed_again(
    app: Flask, other_app: Flask, api: Api, clock: FixedClock, settings: Settings,
    link_for: Callable[..., dict[str, Any]], make_user: Callable[..., str],
    invoke_gateway: Callable[..., Result],
) -> None:
    make_user("dave")
    link = link_for("dave")
    # The page seals the key under v1, then stores it in a later transaction...
    with app.app_context():
        read = db.session().get(Elicitation, link["id"])
        assert read is not None
        generic = current_catalog().get("generic")
        assert generic is not None
        credential = credentials.seal_for(current_keyring(), read, generic, "sk-in-flight",
                                          clock.now())
    assert credential.key_version == 1

    # ...and meanwhile the operator rotates, this instance moves on to v2, the
    # stored secrets are rewrapped and v1 is retired: nothing counted uses it.
    ok(invoke_gateway("keys", "rotate"))
    clock.advance(seconds=versions.REFRESH.total_seconds())
    with app.app_context():
        assert current_keyring().current_version == 2
    ok(invoke_gateway("keys", "rewrap"))
    ok(invoke_gateway("keys", "retire", "v1"))

    with app.test_request_context():
        stored = views.store(link["id"], Subject(settings.public_url, "dave"), credential)
    assert stored.status == "completed"
    [item] = api.get("/api/v1/credentials").get_json()["items"]
    # Every instance opens it, also one that reads the key versions afresh.
    apis = [api, Api(client_for(other_app), api.token)]
    assert failed_reveals(apis, {item["id"]: "sk-in-flight"}) == []
    assert key_version(app, item["id"]) == 2


def test_a_webhook_secret_sealed_under_a_version_retired_meanwhile_is_sealed_again(
    app: Flask, clock: FixedClock, settings: Settings, invoke_gateway: Callable[..., Result],
) -> None:
    with app.app_context():
        assert current_keyring().current_version == 1  # and so it stays for up to REFRESH
    ok(invoke_gateway("keys", "rotate"))
    # Its heartbeat no longer holds v1, as when a sibling's newer one replaced it.
    with app.app_context(), db.transaction() as session:
        for beat in session.scalars(select(VaultInstance)):
            beat.seen_at -= versions.HEARTBEAT_FRESH
    ok(invoke_gateway("keys", "retire", "v1"))

    # Registered with the versions read before the retire (v1), as `gateway clients
    # create` registers: sealed under v1, refused by the database, sealed again.
    with app.app_context():
        keyring = current_keyring()

        def create() -> clients.Minted:
            with db.transaction() as session:
                return clients.create_client(
                    session, clock, keyring=keyring, pepper=settings.token_pepper,
                    catalog=current_catalog(), name="late", webhook_url=None,
                    credential_types=[], actor="test", policy=OutboundPolicy())

        minted = store_sealed(keyring, create)
        client = db.session().get(Client, minted.client.id)
        assert client is not None
        assert current_webhook_secrets(db.session(), clock, keyring, client) == [
            minted.webhook_secret]
        [secret] = db.session().scalars(select(WebhookSecret)).all()
        assert secret.key_version == 2
