"""The mix-up defence (RFC 9700 section 4.4, RFC 9207), against two real providers.

The catalog has two OAuth types: ``example`` at the test provider (the honest
one, B) and ``hostile`` at a second instance of it, with an issuer of its own
(A: a provider in the catalog that turned hostile, or was compromised). Alice
presses Connect for ``hostile``; A sends her browser on to B's authorization
endpoint with the state and PKCE challenge the gateway gave A, hoping that
B's code comes back to the gateway and is posted, with the PKCE verifier, to
A's token endpoint. Each type's own redirect URI, and ``iss`` held to the
type's issuer, stop that: nothing reaches either token endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from flask import Flask

from gateway.audit.models import AuditEvent
from gateway.credentials.models import Credential
from gateway.settings import Settings
from tests.conftest import Api
from tests.integration.portal.conftest import Browser
from tests.integration.portal.test_oauth_connect import path_of, rows, start, status_of
from tests.oidc.fixtures import OidcProvider

SECRET_ENV = "TEST_CONNECT_CLIENT_SECRET"
HONEST = "example"
HOSTILE = "hostile"


def oauth_table(type_id: str, provider: OidcProvider) -> str:
    table = {"issuer": provider.issuer, "client_id": provider.connect_client_id,
             "client_secret_env": SECRET_ENV, "scopes": ["openid", "profile", "repo"],
             "account_field": "preferred_username"}
    return "\n".join([f"[{type_id}]", f'label = "{type_id.title()} account"', 'kind = "oauth"',
                      f"[{type_id}.oauth]",
                      *(f"{key} = {json.dumps(value)}" for key, value in table.items())]) + "\n"


@pytest.fixture
def settings(make_settings: Callable[..., Settings], oidc_provider: OidcProvider,
             second_oidc_provider: OidcProvider, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Settings:
    catalog = tmp_path / "credential_types.toml"
    catalog.write_text('[generic]\nlabel = "API key"\n' + oauth_table(HONEST, oidc_provider)
                       + oauth_table(HOSTILE, second_oidc_provider))
    # Both test providers hold connect-app with the same secret.
    monkeypatch.setenv(SECRET_ENV, oidc_provider.connect_client_secret)
    hosts = ",".join(urlsplit(provider.issuer).netloc
                     for provider in (oidc_provider, second_oidc_provider))
    return make_settings(GATEWAY_CREDENTIAL_TYPES_FILE=str(catalog),
                         GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=hosts)


@pytest.fixture
def link_for(api: Api, settings: Settings) -> Callable[[str], str]:
    """An OAuth elicitation of ``type_id`` for Alice; its id."""

    def make(type_id: str) -> str:
        response = api.post("/api/v1/elicitations", {
            "subject": {"iss": settings.public_url, "sub": "alice"}, "kind": "oauth",
            "credential_type": type_id, "message": "Connect", "reuse_pending": False})
        assert response.status_code == 201, response.get_data(as_text=True)
        created: str = response.get_json()["id"]
        return created

    return make


@pytest.fixture
def alices(browser: Callable[[], Browser], alice: str) -> Browser:
    user = browser()
    user.log_in(alice)
    return user


def sent_on_to(honest: OidcProvider, authorize: str, **changes: str) -> str:
    """The hostile provider's move: the gateway's request to it, sent to the honest one."""
    query = {name: values[0] for name, values in parse_qs(urlsplit(authorize).query).items()}
    return f"{honest.metadata()['authorization_endpoint']}?{urlencode({**query, **changes})}"


def code_calls(provider: OidcProvider) -> int:
    calls: int = provider.connect_stats()["token_calls"].get("authorization_code", 0)
    return calls


def refusals(app: Flask) -> list[dict[str, Any]]:
    return [row.details for row in rows(app, AuditEvent,
                                        AuditEvent.action == "oauth.callback_refused")]


def test_each_type_sends_its_own_redirect_uri(
    alices: Browser, link_for: Callable[[str], str], oidc_provider: OidcProvider,
    second_oidc_provider: OidcProvider,
) -> None:
    for type_id, provider in ((HONEST, oidc_provider), (HOSTILE, second_oidc_provider)):
        authorize = start(alices, link_for(type_id))
        assert authorize.startswith(f"{provider.issuer}/")
        assert parse_qs(urlsplit(authorize).query)["redirect_uri"] == [
            f"https://gateway.test/oauth/callback/{type_id}"]


def test_another_providers_code_at_the_uri_it_was_issued_for_is_refused(
    app: Flask, alices: Browser, link_for: Callable[[str], str], oidc_provider: OidcProvider,
    second_oidc_provider: OidcProvider,
) -> None:
    link = link_for(HOSTILE)
    authorize = start(alices, link)
    # A sends Alice to B with B's own registered redirect URI: B issues a code
    # and sends it, with A's state, to the honest type's address.
    back = oidc_provider.connect_login(
        sent_on_to(oidc_provider, authorize,
                   redirect_uri="https://gateway.test/oauth/callback/example"), "alice")
    assert back.startswith("https://gateway.test/oauth/callback/example?")
    assert parse_qs(urlsplit(back).query)["iss"] == [oidc_provider.issuer]

    refused = alices.get(path_of(back))

    assert refused.status_code == 400
    assert "another provider than the one you were sent to" in refused.get_data(as_text=True)
    assert code_calls(second_oidc_provider) == 0  # A never sees B's code and our verifier
    assert code_calls(oidc_provider) == 0
    assert rows(app, Credential) == []
    assert status_of(app, link) == "opened"
    assert refusals(app) == [{"reason": "redirect-uri-of-another-type", "type": HONEST,
                              "state_type": HOSTILE}]


def test_a_code_whose_iss_is_another_providers_is_refused(
    app: Flask, alices: Browser, link_for: Callable[[str], str], oidc_provider: OidcProvider,
    second_oidc_provider: OidcProvider,
) -> None:
    # The attack as reported: a callback for type A carrying B's code and
    # iss=<B>. B would have to accept A's redirect URI for it; here it does.
    oidc_provider.add_connect_redirect_uri("https://gateway.test/oauth/callback/hostile")
    link = link_for(HOSTILE)
    back = oidc_provider.connect_login(sent_on_to(oidc_provider, start(alices, link)), "alice")
    assert back.startswith("https://gateway.test/oauth/callback/hostile?")
    assert parse_qs(urlsplit(back).query)["iss"] == [oidc_provider.issuer]

    refused = alices.get(path_of(back))

    assert refused.status_code == 400
    assert "another provider than the one you were sent to" in refused.get_data(as_text=True)
    assert code_calls(second_oidc_provider) == 0
    assert code_calls(oidc_provider) == 0
    assert rows(app, Credential) == []
    assert status_of(app, link) == "opened"
    assert refusals(app) == [{"reason": "issuer-mismatch", "type": HOSTILE,
                              "iss": oidc_provider.issuer}]


def test_a_return_without_the_iss_its_provider_promises_is_refused(
    app: Flask, alices: Browser, link_for: Callable[[str], str], oidc_provider: OidcProvider,
) -> None:
    assert oidc_provider.metadata()["authorization_response_iss_parameter_supported"] is True
    oidc_provider.set_connect(send_iss=False)
    link = link_for(HONEST)
    back = oidc_provider.connect_login(start(alices, link), "alice")
    assert "iss=" not in back

    refused = alices.get(path_of(back))

    assert refused.status_code == 400
    assert "does not say which provider sent it" in refused.get_data(as_text=True)
    assert code_calls(oidc_provider) == 0
    assert rows(app, Credential) == []
    assert refusals(app) == [{"reason": "issuer-missing", "type": HONEST}]


def test_a_provider_that_does_not_promise_iss_may_leave_it_out(
    app: Flask, alices: Browser, link_for: Callable[[str], str], oidc_provider: OidcProvider,
) -> None:
    oidc_provider.set_discovery(authorization_response_iss_parameter_supported=None)
    oidc_provider.set_connect(send_iss=False)
    link = link_for(HONEST)
    back = oidc_provider.connect_login(start(alices, link), "alice")
    assert "iss=" not in back

    done = alices.get(path_of(back))

    assert done.status_code == 200, done.get_data(as_text=True)
    assert "is connected" in done.get_data(as_text=True)
    assert status_of(app, link) == "completed"


def test_the_right_iss_at_the_right_uri_connects(
    app: Flask, alices: Browser, link_for: Callable[[str], str], oidc_provider: OidcProvider,
) -> None:
    link = link_for(HONEST)
    back = oidc_provider.connect_login(start(alices, link), "alice")
    assert parse_qs(urlsplit(back).query)["iss"] == [oidc_provider.issuer]
    assert alices.get(path_of(back)).status_code == 200
    assert status_of(app, link) == "completed"
    assert code_calls(oidc_provider) == 1


def test_the_old_shared_callback_takes_nothing_and_says_the_address_changed(
    app: Flask, alices: Browser, link_for: Callable[[str], str], oidc_provider: OidcProvider,
) -> None:
    link = link_for(HONEST)
    back = oidc_provider.connect_login(start(alices, link), "alice")
    old = path_of(back).replace("/oauth/callback/example?", "/oauth/callback?")

    gone = alices.get(old)

    assert gone.status_code == 410
    text = gone.get_data(as_text=True)
    assert "no longer takes answers from providers" in text
    assert "Nothing was stored" in text
    assert code_calls(oidc_provider) == 0
    assert status_of(app, link) == "opened"
    # The state was not read, let alone used up: the real return still works.
    assert alices.get(path_of(back)).status_code == 200
    assert status_of(app, link) == "completed"


def test_a_return_to_a_type_that_is_not_an_oauth_type_is_not_found(alices: Browser) -> None:
    for type_id in ("generic", "nonesuch"):
        missing = alices.get(f"/oauth/callback/{type_id}?code=abc&state=made-up")
        assert missing.status_code == 404
        assert "No kind of account is connected at this address" in \
            missing.get_data(as_text=True)
