"""At the callback, the provider's token answer is checked before anything is stored: a
lifetime of 10^12 seconds is cut to ten years, a token type other than Bearer stores nothing
and says so in plain words (RFC 6749 section 7.1)."""

from __future__ import annotations

import html
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from flask import Flask
from sqlalchemy import select
from werkzeug.test import TestResponse

from gateway import db
from gateway.clock import FixedClock, SystemClock
from gateway.credentials.models import Credential
from gateway.elicitations.models import Elicitation
from gateway.identity import service as identity
from gateway.settings import Settings
from tests.conftest import Api, client_for
from tests.integration.oauth.conftest import TYPE, stored, tokens_of
from tests.integration.portal.conftest import PASSWORD, Browser
from tests.oidc.fixtures import OidcProvider

pytestmark = pytest.mark.slow

TEN_YEARS = timedelta(days=3650)


def connect_through_the_callback(app: Flask, api: Api, settings: Settings,
                                 provider: OidcProvider) -> tuple[str, TestResponse]:
    """Alice connects her account in her browser; the elicitation and the callback's answer."""
    with app.app_context(), db.transaction() as session:
        identity.create_user(session, SystemClock(), username="alice", password=PASSWORD,
                             actor="test")
    browser = Browser(client_for(app))
    assert browser.log_in("alice").status_code == 303
    created = api.post("/api/v1/elicitations", {
        "subject": {"iss": settings.public_url, "sub": "alice"}, "kind": "oauth",
        "credential_type": TYPE, "message": "Connect your Example account"})
    assert created.status_code == 201, created.get_data(as_text=True)
    elicitation_id: str = created.get_json()["id"]
    page = f"/e/{elicitation_id}"
    sent = browser.post_form(f"{page}/connect", {}, page=page)
    assert sent.status_code == 303, sent.get_data(as_text=True)
    back = urlsplit(provider.connect_login(str(sent.headers["Location"]), "alice"))
    return elicitation_id, browser.get(f"{back.path}?{back.query}")


def credentials_of(app: Flask, elicitation_id: str) -> list[Credential]:
    with app.app_context():
        return list(db.session().scalars(select(Credential).where(
            Credential.elicitation_id == elicitation_id)))


def status_of(app: Flask, elicitation_id: str) -> str:
    with app.app_context():
        elicitation = db.session().get(Elicitation, elicitation_id)
        assert elicitation is not None
        return elicitation.status


def test_an_answer_expiring_in_ten_to_the_twelfth_seconds_is_stored_capped_at_ten_years(
    app: Flask, api: Api, settings: Settings, clock: FixedClock, oidc_provider: OidcProvider,
) -> None:
    oidc_provider.set_connect(answer_patch={"expires_in": 10**12, "token_type": "BEARER"},
                              fault_grant_types=["authorization_code"])
    elicitation_id, answer = connect_through_the_callback(app, api, settings, oidc_provider)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert status_of(app, elicitation_id) == "completed"
    [credential] = credentials_of(app, elicitation_id)
    assert stored(app, credential.id).token_expires_at == clock.now() + TEN_YEARS
    assert tokens_of(app, credential.id).token_type == "Bearer"
    revealed = api.post(f"/api/v1/credentials/{credential.id}/reveal").get_json()
    assert revealed["token_type"] == "Bearer"


@pytest.mark.parametrize(("patch", "words"), [
    ({"token_type": "DPoP " + "x" * 2000}, "its token_type is not Bearer"),
    ({"expires_in": "in a while"}, "its expires_in is not a number of seconds"),
    ({"refresh_token": 42}, "its refresh_token is not a string"),
])
def test_an_unusable_answer_at_the_callback_stores_nothing_and_says_why(
    app: Flask, api: Api, settings: Settings, oidc_provider: OidcProvider,
    patch: dict[str, object], words: str,
) -> None:
    oidc_provider.set_connect(answer_patch=patch, fault_grant_types=["authorization_code"])
    elicitation_id, answer = connect_through_the_callback(app, api, settings, oidc_provider)
    assert answer.status_code == 400
    page = html.unescape(answer.get_data(as_text=True))
    assert words in page
    assert "Nothing was stored." in page
    assert "xxxx" not in page
    assert credentials_of(app, elicitation_id) == []
    assert status_of(app, elicitation_id) == "opened"  # the link stays open to try again
