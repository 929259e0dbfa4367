"""Revoking a connection revokes its tokens at the provider too (RFC 7009), whoever revokes
it; a provider that fails to answer, or a type gone from the catalog, stops only that part."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask
from werkzeug.test import TestResponse

from gateway import db
from gateway.clock import FixedClock, SystemClock
from gateway.identity import service as identity
from tests.conftest import Api, client_for
from tests.integration.conftest import Result
from tests.integration.oauth.conftest import (
    MARGIN_SECONDS,
    TOKEN_SECONDS,
    TYPE,
    Connection,
    audit_rows,
    revoked_events,
    stored,
)
from tests.integration.portal.conftest import PASSWORD, Browser
from tests.oidc.fixtures import OidcProvider

pytestmark = pytest.mark.slow

REVOKED = "revoked at the provider"


def delete(api: Api, connection: Connection) -> None:
    answer = api.client.delete(f"/api/v1/credentials/{connection.id}", headers=api.headers())
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["status"] == "revoked"


def at_provider(app: Flask, connection: Connection) -> str:
    """What the audit row of the connection's revocation at its provider says it did."""
    assert len(audit_rows(app, "credential.revoked", connection.id)) == 1
    [revoked] = audit_rows(app, "credential.provider_revoked", connection.id)
    outcome: str = revoked.details["provider_revocation"]
    return outcome


def refresh_is_refused(provider: OidcProvider, connection: Connection) -> bool:
    answer = provider.connect_refresh(connection.refresh_token)
    return answer.status_code == 400 and answer.json()["error"] == "invalid_grant"


def test_a_connection_revoked_by_its_mcp_server_is_revoked_at_the_provider(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
) -> None:
    connection = connect("alice")
    delete(api, connection)
    assert not stored(app, connection.id).live
    assert at_provider(app, connection) == REVOKED
    sent = [(r["token_type_hint"], r["token"], r["status"])
            for r in oidc_provider.connect_stats()["revocations"]]
    assert sent == [("refresh_token", connection.refresh_token, 200),
                    ("access_token", connection.access_token, 200)]
    assert refresh_is_refused(oidc_provider, connection)


def test_a_connection_revoked_by_its_user_is_revoked_at_the_provider(
    app: Flask, connect: Callable[..., Connection], oidc_provider: OidcProvider,
) -> None:
    connection = connect("alice")
    with app.app_context(), db.transaction() as session:
        identity.create_user(session, SystemClock(), username="alice", password=PASSWORD,
                             actor="test")
    user = Browser(client_for(app))
    assert user.log_in("alice").status_code == 303
    answer = user.post_form(f"/account/credentials/{connection.id}/revoke", {},
                            page="/account")
    assert answer.status_code == 303
    assert not stored(app, connection.id).live
    assert at_provider(app, connection) == REVOKED
    assert refresh_is_refused(oidc_provider, connection)


def test_a_connection_revoked_by_the_operator_is_revoked_at_the_provider(
    app: Flask, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    invoke_gateway: Callable[..., Result],
) -> None:
    connection = connect("alice")
    result = invoke_gateway("credentials", "revoke", connection.id)
    assert result.code == 0, result.stderr
    assert result.stdout.splitlines() == [f"credential {connection.id} revoked",
                                          f"at the provider: {REVOKED}"]
    assert not stored(app, connection.id).live
    assert at_provider(app, connection) == REVOKED
    assert refresh_is_refused(oidc_provider, connection)


@pytest.mark.parametrize(("fault", "said", "requests"), [
    ("server_error", "the provider answered HTTP 503", 2),
    # Not waited for a second time: the access token is not sent.
    ("slow", "the provider did not answer (ReadTimeout)", 1),
])
def test_a_provider_that_fails_to_revoke_does_not_stop_the_revocation_here(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    fault: str, said: str, requests: int,
) -> None:
    connection = connect("alice")
    oidc_provider.set_connect(revocation_fault=fault)
    delete(api, connection)
    assert not stored(app, connection.id).live
    assert at_provider(app, connection) == said
    assert len(oidc_provider.connect_stats()["revocations"]) == requests
    [event] = revoked_events(app)
    assert json.loads(event.body)["data"]["reason"] == "client"
    again = api.post(f"/api/v1/credentials/{connection.id}/reveal")
    assert again.status_code == 409


def test_a_type_gone_from_the_catalog_is_revoked_here_and_the_audit_row_says_so(
    app: Flask, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
) -> None:
    connection = connect("alice")
    without = tmp_path / "without-example.toml"
    without.write_text('[generic]\nlabel = "API key"\n')
    result = invoke_gateway("credentials", "revoke", connection.id,
                            env={**cli_environ, "GATEWAY_CREDENTIAL_TYPES_FILE": str(without)})
    assert result.code == 0, result.stderr
    assert not stored(app, connection.id).live
    said = f"not revoked at the provider: {TYPE!r} is no longer an OAuth type in the catalog"
    assert at_provider(app, connection) == said
    assert oidc_provider.connect_stats()["revocations"] == []


def test_revoking_a_revoked_connection_is_a_conflict_and_asks_the_provider_nothing(
    api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
) -> None:
    connection = connect("alice")
    delete(api, connection)
    oidc_provider.reset_connect_stats()
    again = api.client.delete(f"/api/v1/credentials/{connection.id}", headers=api.headers())
    assert again.status_code == 409
    assert oidc_provider.connect_stats()["revocations"] == []


def test_a_revocation_during_a_refresh_hands_out_nothing_and_revokes_the_new_tokens(
    app: Flask, api: Api, connect: Callable[..., Connection], oidc_provider: OidcProvider,
    clock: FixedClock,
) -> None:
    connection = connect("alice")
    # The provider rotates at once and answers 1.5 s later (within the read timeout); its
    # revocations take as long, so the DELETE is still asking it when the new tokens arrive.
    oidc_provider.set_connect(token_fault="slow", slow_seconds=1.5,
                              fault_grant_types=["refresh_token"], revocation_fault="slow")
    clock.advance(seconds=TOKEN_SECONDS - MARGIN_SECONDS + 10)
    revealed: list[TestResponse] = []
    refreshing = threading.Thread(target=lambda: revealed.append(
        api.post(f"/api/v1/credentials/{connection.id}/reveal")))
    refreshing.start()
    time.sleep(0.5)  # the reveal holds the lease, the provider holds its answer
    delete(api, connection)
    refreshing.join(timeout=60)

    [answer] = revealed
    # The MCP server is told the connection is gone, and handed no token.
    assert answer.status_code == 409, answer.get_data(as_text=True)
    assert "secret" not in (answer.get_json() or {})
    row = stored(app, connection.id)
    assert (row.live, row.revoked_reason) == (False, "client")
    assert (row.refresh_lease_until, row.refresh_lease_holder) == (None, None)
    assert audit_rows(app, "credential.refreshed", connection.id) == []
    # The tokens the refresh obtained were revoked at the provider as orphans.
    sent = [(r["token_type_hint"], r["token"]) for r in
            oidc_provider.connect_stats()["revocations"]]
    assert sent[0] == ("refresh_token", connection.refresh_token)
    orphans = [token for hint, token in sent
               if hint == "refresh_token" and token != connection.refresh_token]
    assert len(orphans) == 1
    assert at_provider(app, connection) == REVOKED
