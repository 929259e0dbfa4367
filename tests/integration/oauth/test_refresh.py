"""A reveal hands out a working access token: refreshed first when it is about to expire,
once for every reveal at the same moment, on every instance; a refused refresh ends the
connection, a provider that is down leaves it as it was."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import update
from werkzeug.test import TestResponse

from gateway import db
from gateway.app import create_app
from gateway.clock import FixedClock
from gateway.credentials import service
from gateway.credentials.catalog import current_catalog
from gateway.credentials.models import Credential
from gateway.db_clock import database_now
from gateway.elicitations.models import Elicitation
from gateway.oauth.refresh import lease_for
from gateway.settings import Settings
from gateway.tokens import new_id
from gateway.vault.keyring import current_keyring
from tests.conftest import Api, Registered, client_for
from tests.integration.conftest import Result
from tests.integration.oauth.conftest import (
    MARGIN_SECONDS,
    SCOPE,
    SECRET_ENV,
    TOKEN_SECONDS,
    TYPE,
    Connection,
    audit_rows,
    refresh_calls,
    revoked_events,
    stored,
    tokens_of,
)
from tests.oidc.fixtures import OidcProvider, new_session

pytestmark = pytest.mark.slow

ON_POSTGRES = os.environ.get("TEST_DATABASE_URL", "").startswith("postgresql")
# Reveals at once of one expiring connection: SQLite's one file takes fewer.
CONCURRENT_REVEALS = 50 if ON_POSTGRES else 12
# Long enough that every reveal arrives while the one refresh is under way.
REFRESH_DELAY_MS = 1000


def reveal(api: Api, connection: Connection) -> TestResponse:
    return api.post(f"/api/v1/credentials/{connection.id}/reveal")


def expire_soon(clock: FixedClock) -> None:
    """Move the clock to within the margin of the access token's expiry."""
    clock.advance(seconds=TOKEN_SECONDS - MARGIN_SECONDS + 10)


def works_at_the_provider(provider: OidcProvider, access_token: str) -> bool:
    """Whether the provider's API takes the access token."""
    answer = new_session().get(f"{provider.issuer}/api/user", timeout=10,
                               headers={"Authorization": f"Bearer {access_token}"})
    return answer.status_code == 200


def reveal_at_once(connection: Connection, mcp: Registered, instances: list[Flask],
                   count: int) -> list[tuple[int, Any]]:
    """``count`` reveals sent together, spread over ``instances``: each status and body."""
    start = threading.Barrier(count)
    answers: list[tuple[int, Any]] = []

    def reveal_on(instance: Flask) -> None:
        api = Api(client_for(instance), mcp.api_token)
        start.wait()
        answer = reveal(api, connection)
        answers.append((answer.status_code, answer.get_json()))

    threads = [threading.Thread(target=reveal_on, args=(instances[number % len(instances)],))
               for number in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(answers) == count, "a reveal did not answer within a minute"
    return answers


def problem_code(response: TestResponse) -> str:
    assert response.mimetype == "application/problem+json", response.get_data(as_text=True)
    kind: str = response.get_json()["type"]
    return kind.rsplit(":", 1)[1]


def test_a_fresh_token_is_handed_out_as_stored_without_asking_the_provider(
    api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock,
) -> None:
    connection = connect("alice")
    answer = reveal(api, connection)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.headers["Cache-Control"] == "no-store"
    expires_at = (clock.now() + timedelta(seconds=TOKEN_SECONDS)).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")
    assert answer.get_json() == {
        "id": connection.id, "type": TYPE, "secret": connection.access_token,
        "token_type": "Bearer", "expires_at": expires_at, "scopes": SCOPE.split(),
        "account": "alice"}
    assert refresh_calls(oidc_provider) == 0


def test_an_api_key_reveal_keeps_its_three_fields(
    app: Flask, api: Api, mcp: Registered, settings: Settings, clock: FixedClock,
) -> None:
    with app.app_context(), db.transaction() as session:
        elicitation = Elicitation(
            id=new_id("el_", 18), client_id=mcp.id, subject_iss=settings.public_url,
            subject_sub="alice", kind="api_key", credential_type="generic",
            message="Connect your weather API key", metadata_={}, status="opened",
            created_at=clock.now(), expires_at=clock.now() + timedelta(minutes=15),
            opened_at=clock.now(), ended_at=None)
        session.add(elicitation)
        session.flush()
        generic = current_catalog().get("generic")
        assert generic is not None
        credential = service.seal_for(current_keyring(), elicitation, generic,
                                      "wx-live-0123456789abcdef", clock.now())
        service.capture(session, clock, elicitation, credential, actor="test", source_ip=None)
    answer = api.post(f"/api/v1/credentials/{credential.id}/reveal")
    assert answer.get_json() == {"id": credential.id, "type": "generic",
                                 "secret": "wx-live-0123456789abcdef"}


def test_an_expiring_token_is_refreshed_first_and_the_rotated_refresh_token_kept(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock,
) -> None:
    connection = connect("alice")
    expire_soon(clock)
    answer = reveal(api, connection)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    revealed = answer.get_json()
    assert revealed["secret"] != connection.access_token
    assert works_at_the_provider(oidc_provider, revealed["secret"])
    assert refresh_calls(oidc_provider) == 1

    row = stored(app, connection.id)
    assert (row.refreshed_at, row.token_expires_at) == (
        clock.now(), clock.now() + timedelta(seconds=TOKEN_SECONDS))
    assert (row.refresh_lease_until, row.refresh_lease_holder) == (None, None)
    sealed = tokens_of(app, connection.id)
    assert sealed.access_token == revealed["secret"]
    assert sealed.refresh_token not in (None, connection.refresh_token)
    [refreshed] = audit_rows(app, "credential.refreshed", connection.id)
    assert refreshed.details["refresh_token_rotated"] is True
    assert len(audit_rows(app, "credential.revealed", connection.id)) == 1

    # Fresh now: the next reveal hands out the same token without a refresh.
    assert reveal(api, connection).get_json()["secret"] == revealed["secret"]
    assert refresh_calls(oidc_provider) == 1
    # The old refresh token was used up by the refresh (last: reusing it ends the grant).
    reused = oidc_provider.connect_refresh(connection.refresh_token)
    assert (reused.status_code, reused.json()["error"]) == (400, "invalid_grant")


def test_a_token_that_lives_less_than_the_margin_is_refreshed_at_half_its_life(
    api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock,
) -> None:
    oidc_provider.set_connect(access_token_ttl=40)  # shorter than the 60 s margin
    connection = connect("alice")
    clock.advance(seconds=10)
    assert reveal(api, connection).get_json()["secret"] == connection.access_token
    clock.advance(seconds=10)
    assert reveal(api, connection).get_json()["secret"] != connection.access_token
    assert refresh_calls(oidc_provider) == 1


def test_concurrent_reveals_on_two_instances_share_one_refresh(
    app: Flask, other_app: Flask, mcp: Registered, connect: Callable[..., Connection],
    oidc_provider: OidcProvider, clock: FixedClock,
) -> None:
    connection = connect("alice")
    oidc_provider.set_connect(refresh_delay_ms=REFRESH_DELAY_MS)
    expire_soon(clock)
    answers = reveal_at_once(connection, mcp, [app, other_app], CONCURRENT_REVEALS)
    assert [status for status, _ in answers] == [200] * CONCURRENT_REVEALS, answers
    secrets = {body["secret"] for _, body in answers}
    assert len(secrets) == 1
    assert secrets != {connection.access_token}
    assert refresh_calls(oidc_provider) == 1
    assert len(audit_rows(app, "credential.refreshed", connection.id)) == 1
    assert len(audit_rows(app, "credential.revealed", connection.id)) == CONCURRENT_REVEALS
    assert works_at_the_provider(oidc_provider, secrets.pop())


def test_a_refused_refresh_revokes_the_connection_and_asks_for_a_reconnect(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock,
) -> None:
    connection = connect("alice")
    oidc_provider.set_connect(token_fault="invalid_grant", fault_grant_types=["refresh_token"])
    expire_soon(clock)
    answer = reveal(api, connection)
    assert answer.status_code == 409
    assert problem_code(answer) == "reconnect-required"

    row = stored(app, connection.id)
    assert (row.live, row.revoked_reason) == (False, "refresh-failed")
    assert (row.refresh_lease_until, row.refresh_lease_holder) == (None, None)
    [event] = revoked_events(app)
    assert json.loads(event.body)["data"] == {
        "credential_id": connection.id, "type": TYPE,
        "subject": {"iss": row.subject_iss, "sub": "alice"}, "reason": "refresh-failed"}
    [revoked] = audit_rows(app, "credential.revoked", connection.id)
    assert revoked.details["provider_error"] == "invalid_grant"
    # Said again on every later reveal, without asking the provider again.
    again = reveal(api, connection)
    assert (again.status_code, problem_code(again)) == (409, "reconnect-required")
    assert refresh_calls(oidc_provider) == 1


@pytest.mark.parametrize("fault", ["server_error", "slow", "html", "oversize",
                                   "missing_access_token", "invalid_client", "invalid_request",
                                   "throttled"])
def test_a_provider_that_fails_leaves_the_connection_as_it_was_and_answers_503(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock, fault: str,
) -> None:
    connection = connect("alice")
    oidc_provider.set_connect(token_fault=fault, fault_grant_types=["refresh_token"])
    expire_soon(clock)
    answer = reveal(api, connection)
    assert answer.status_code == 503, answer.get_data(as_text=True)
    assert problem_code(answer) == "provider-unavailable"
    assert int(answer.headers["Retry-After"]) > 0
    assert connection.access_token not in answer.get_data(as_text=True)

    row = stored(app, connection.id)
    assert row.live
    assert (row.refreshed_at, row.refresh_lease_until, row.refresh_lease_holder) == (
        None, None, None)
    sealed = tokens_of(app, connection.id)
    assert (sealed.access_token, sealed.refresh_token) == (
        connection.access_token, connection.refresh_token)
    assert audit_rows(app, "credential.refreshed", connection.id) == []
    assert revoked_events(app) == []


def test_once_the_provider_is_back_the_connection_refreshes(
    api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock,
) -> None:
    connection = connect("alice")
    oidc_provider.set_connect(token_fault="server_error", fault_grant_types=["refresh_token"])
    expire_soon(clock)
    assert reveal(api, connection).status_code == 503
    oidc_provider.set_connect(token_fault=None)
    answer = reveal(api, connection)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["secret"] != connection.access_token
    assert refresh_calls(oidc_provider) == 2


def test_when_the_provider_fails_a_refresh_the_reveals_waiting_for_it_do_not_ask_again(
    app: Flask, other_app: Flask, mcp: Registered, connect: Callable[..., Connection],
    oidc_provider: OidcProvider, clock: FixedClock,
) -> None:
    connection = connect("alice")
    oidc_provider.set_connect(refresh_delay_ms=REFRESH_DELAY_MS, token_fault="server_error",
                              fault_grant_types=["refresh_token"])
    expire_soon(clock)
    answers = reveal_at_once(connection, mcp, [app, other_app], CONCURRENT_REVEALS // 2)
    assert [status for status, _ in answers] == [503] * (CONCURRENT_REVEALS // 2), answers
    assert refresh_calls(oidc_provider) == 1
    assert stored(app, connection.id).live


def test_a_lease_whose_holder_died_is_taken_over_once_it_runs_out(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock,
) -> None:
    connection = connect("alice")
    expire_soon(clock)
    # Lease times are the database's: this one runs out now, whatever the app's clock says.
    with app.app_context(), db.transaction() as session:
        session.execute(update(Credential).where(Credential.id == connection.id).values(
            refresh_lease_holder="rl_gone", refresh_lease_until=database_now()))
    answer = reveal(api, connection)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["secret"] != connection.access_token
    assert refresh_calls(oidc_provider) == 1
    row = stored(app, connection.id)
    assert (row.refresh_lease_until, row.refresh_lease_holder) == (None, None)


def test_a_token_set_without_a_refresh_token_is_handed_out_as_stored(
    api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock,
) -> None:
    answer = {**oidc_provider.connect_tokens("alice", scope=SCOPE)}
    del answer["refresh_token"]
    connection = connect("alice", answer=answer)
    clock.advance(seconds=TOKEN_SECONDS + 1)  # expired, and nothing to refresh it with
    revealed = reveal(api, connection)
    assert revealed.status_code == 200, revealed.get_data(as_text=True)
    assert revealed.get_json()["secret"] == connection.access_token
    assert refresh_calls(oidc_provider) == 0


def test_a_connection_whose_type_left_the_catalog_is_handed_out_as_stored(
    connect: Callable[..., Connection], mcp: Registered, oidc_provider: OidcProvider,
    make_settings: Callable[..., Settings], clock: FixedClock, tmp_path: Path,
) -> None:
    connection = connect("alice")
    without = tmp_path / "without-example.toml"
    without.write_text('[generic]\nlabel = "API key"\n')
    trimmed = create_app(make_settings(GATEWAY_CREDENTIAL_TYPES_FILE=str(without)), clock=clock)
    try:
        expire_soon(clock)
        revealed = reveal(Api(client_for(trimmed), mcp.api_token), connection)
    finally:
        trimmed.extensions["gateway.engine"].dispose()
    assert revealed.status_code == 200, revealed.get_data(as_text=True)
    assert revealed.get_json()["secret"] == connection.access_token
    assert refresh_calls(oidc_provider) == 0


# --- only invalid_grant ends a connection ----------------------------------------------------


def unchanged(app: Flask, connection: Connection) -> bool:
    """Whether the connection is live, holds the tokens it was made with, and no lease."""
    row = stored(app, connection.id)
    sealed = tokens_of(app, connection.id)
    return (row.live, row.refreshed_at, row.refresh_lease_until, row.refresh_lease_holder,
            sealed.access_token, sealed.refresh_token) == (
        True, None, None, None, connection.access_token, connection.refresh_token)


@pytest.mark.parametrize(("retry_after", "answered"), [
    ("120", "120"), ("86400", "300"), ("Wed, 21 Oct 2099 07:28:00 GMT", "300"), (None, "30")])
def test_a_throttled_refresh_passes_the_providers_retry_after_on_capped(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock, retry_after: str | None, answered: str,
) -> None:
    connection = connect("alice")
    oidc_provider.set_connect(token_fault="throttled", fault_grant_types=["refresh_token"],
                              retry_after=retry_after)
    expire_soon(clock)
    answer = reveal(api, connection)
    assert (answer.status_code, problem_code(answer)) == (503, "provider-unavailable")
    assert answer.headers["Retry-After"] == answered
    assert "HTTP 429" in answer.get_json()["detail"]
    assert unchanged(app, connection)
    assert revoked_events(app) == []


def test_a_refused_client_is_logged_as_an_error_and_shown_by_status_and_ends_nothing(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock, invoke_gateway: Callable[..., Result],
    caplog: pytest.LogCaptureFixture,
) -> None:
    connection = connect("alice")
    oidc_provider.set_connect(token_fault="invalid_client", fault_grant_types=["refresh_token"])
    expire_soon(clock)
    with caplog.at_level(logging.INFO, logger="gateway.oauth.provider"):
        answer = reveal(api, connection)
    assert (answer.status_code, problem_code(answer)) == (503, "provider-unavailable")
    assert "invalid_client" in answer.get_json()["detail"]
    assert unchanged(app, connection)
    assert revoked_events(app) == []
    [logged] = [r for r in caplog.records if "invalid_client" in r.getMessage()]
    assert logged.levelno == logging.ERROR
    assert oidc_provider.connect_client_secret not in caplog.text
    [refused] = audit_rows(app, "oauth.client_refused", TYPE)
    assert refused.details == {"credential_id": connection.id,
                               "provider_error": "invalid_client"}

    result = invoke_gateway("status", "--json")
    report = json.loads(result.stdout)
    assert list(report["oauth_client_refused"]) == [TYPE]
    text = invoke_gateway("status").stdout
    assert f"{TYPE}: its provider last refused the gateway's client (invalid_client)" in text

    # Once the operator has fixed the client, the same connection refreshes.
    oidc_provider.set_connect(token_fault=None)
    assert reveal(api, connection).status_code == 200


def test_a_rotated_client_secret_leaves_every_connection_as_it_was(
    connect: Callable[..., Connection], mcp: Registered, oidc_provider: OidcProvider,
    make_settings: Callable[..., Settings], clock: FixedClock, app: Flask,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connection = connect("alice")
    # The real provider, refusing a secret that is no longer its client's.
    monkeypatch.setenv(SECRET_ENV, "an-old-secret")
    rotated = create_app(make_settings(), clock=clock)
    try:
        expire_soon(clock)
        answer = reveal(Api(client_for(rotated), mcp.api_token), connection)
    finally:
        rotated.extensions["gateway.engine"].dispose()
    assert (answer.status_code, problem_code(answer)) == (503, "provider-unavailable")
    assert [r["status"] for r in oidc_provider.connect_stats()["token_requests"]] == [401]
    assert unchanged(app, connection)


# --- a refresh never outlives its lease --------------------------------------------------


def test_a_trickled_answer_is_cut_off_before_the_lease_runs_out_and_not_sent_twice(
    app: Flask, other_app: Flask, mcp: Registered, connect: Callable[..., Connection],
    oidc_provider: OidcProvider, clock: FixedClock, settings: Settings,
) -> None:
    connection = connect("alice")
    with app.app_context():
        example = current_catalog().get(TYPE)
        assert example is not None
        assert example.oauth is not None
        lease = lease_for(example.oauth).total_seconds()
    # Each piece well within the read timeout; the whole longer than the lease.
    oidc_provider.set_connect(token_fault="trickle", slow_seconds=lease + 4,
                              fault_grant_types=["refresh_token"])
    expire_soon(clock)
    answers: dict[str, tuple[int, float]] = {}
    started = time.monotonic()

    def reveal_on(name: str, instance: Flask) -> None:
        answer = reveal(Api(client_for(instance), mcp.api_token), connection)
        answers[name] = (answer.status_code, time.monotonic() - started)

    first = threading.Thread(target=reveal_on, args=("first", app))
    first.start()
    time.sleep(1)  # the first holds the lease and reads the trickle
    second = threading.Thread(target=reveal_on, args=("second", other_app))
    second.start()
    first.join(timeout=60)
    second.join(timeout=60)

    assert answers["first"][0] == 503
    assert answers["first"][1] < lease  # cut off by the deadline, before the lease ran out
    # The second waited for the first, and did not send the same refresh token again.
    assert answers["second"][0] == 503
    assert refresh_calls(oidc_provider) == 1
    row = stored(app, connection.id)
    assert row.live
    assert (row.refresh_lease_until, row.refresh_lease_holder) == (None, None)


def test_an_instance_whose_clock_runs_ahead_does_not_take_over_a_running_lease(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock,
) -> None:
    connection = connect("alice")
    # Another instance holds the lease for two more seconds by the database's clock...
    with app.app_context(), db.transaction() as session:
        session.execute(update(Credential).where(Credential.id == connection.id).values(
            refresh_lease_holder="rl_other", refresh_lease_until=database_now(2)))
    # ...and this instance's clock is a day ahead.
    clock.advance(days=1)
    answers: list[TestResponse] = []
    waiting = threading.Thread(target=lambda: answers.append(reveal(api, connection)))
    waiting.start()
    time.sleep(1)
    assert refresh_calls(oidc_provider) == 0  # still waiting for the lease
    waiting.join(timeout=30)
    [answer] = answers
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert refresh_calls(oidc_provider) == 1


# --- token answers are checked before anything changes -------------------------------------

TEN_YEARS = timedelta(days=3650)


def test_a_refresh_answering_expires_in_ten_to_the_twelfth_is_stored_capped_at_ten_years(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock,
) -> None:
    connection = connect("alice")
    oidc_provider.set_connect(answer_patch={"expires_in": 10**12, "token_type": "bearer"},
                              fault_grant_types=["refresh_token"])
    expire_soon(clock)
    answer = reveal(api, connection)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["token_type"] == "Bearer"
    row = stored(app, connection.id)
    assert row.token_expires_at == clock.now() + TEN_YEARS
    assert (row.refresh_lease_until, row.refresh_lease_holder) == (None, None)
    sealed = tokens_of(app, connection.id)
    assert sealed.refresh_token not in (None, connection.refresh_token)
    assert sealed.token_type == "Bearer"


@pytest.mark.parametrize(("patch", "words"), [
    ({"token_type": "DPoP " + "x" * 2000}, "its token_type is not Bearer"),
    ({"token_type": "mac"}, "its token_type is not Bearer"),
    ({"expires_in": "soon"}, "its expires_in is not a number"),
    ({"access_token": 12345}, "its access_token is not a string"),
    ({"scope": {"repo": True}}, "its scope is not a string of scope names"),
    ({"id_token": 5}, "its id_token is not a string"),
])
def test_an_unusable_refresh_answer_stores_nothing_frees_the_lease_and_says_why(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock, patch: dict[str, Any], words: str,
) -> None:
    connection = connect("alice")
    oidc_provider.set_connect(answer_patch=patch, fault_grant_types=["refresh_token"])
    expire_soon(clock)
    answer = reveal(api, connection)
    assert (answer.status_code, problem_code(answer)) == (503, "provider-unavailable")
    assert int(answer.headers["Retry-After"]) > 0
    detail = answer.get_json()["detail"]
    assert words in detail
    assert "xxxx" not in detail
    assert unchanged(app, connection)
    assert audit_rows(app, "credential.refreshed", connection.id) == []
