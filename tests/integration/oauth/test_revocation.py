"""Revoking a connection revokes its tokens at the provider too (RFC 7009), whoever revokes
it; a provider that fails to answer, or a type gone from the catalog, stops only that part."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask

from gateway import db
from gateway.clock import SystemClock
from gateway.identity import service as identity
from tests.conftest import Api, client_for
from tests.integration.conftest import Result
from tests.integration.oauth.conftest import (
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
