"""Connecting a third-party account in Chromium: the gateway, the provider's pages, and back.

The provider in tests/oidc plays the third party (its client ``connect-app``)
and the OAuth gateway of the conftest has it in its catalog. The browser
really goes there: the watch lets exactly the provider's origin through.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import BrowserContext, Page, Request, expect

from tests.browser.conftest import CONNECTION_TYPE, Gateway, Screenshot, Watch, log_in
from tests.oidc.fixtures import OidcProvider

pytestmark = pytest.mark.slow

REDIRECT_PATH = f"/oauth/callback/{CONNECTION_TYPE}"

MESSAGE = ("Connect your Example account so that Weather Forecasts can open an issue when a "
           "storm warning affects one of your projects.")
SCOPES = ["openid", "profile", "repo"]


def open_connect_page(context: BrowserContext, gateway: Gateway, username: str,
                      link: dict[str, Any]) -> Page:
    """A page of ``context`` on the link, after logging in at the gateway as ``username``."""
    page = context.new_page()
    page.goto(link["url"])
    log_in(page, username)
    expect(page).to_have_url(link["url"])
    return page


def press_connect(page: Page, provider: OidcProvider) -> str:
    """Press Connect; wait for the provider's login page. The authorization URL sent to."""
    host = urlsplit(provider.issuer).netloc
    with page.expect_request(re.compile(re.escape(f"{provider.issuer}/auth?"))) as sent:
        page.get_by_role("button", name=f"Connect at {host}").click()
    expect(page.locator("input[name=login]")).to_be_visible()
    return sent.value.url


def sign_in_at_provider(page: Page, provider: OidcProvider, account: str) -> None:
    """Fill in the provider's login form as ``account``; wait for its consent page."""
    page.locator("input[name=login]").fill(account)
    page.locator("input[name=password]").fill(provider.password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Allow")).to_be_visible()


def credentials_of(gateway: Gateway, username: str) -> list[dict[str, Any]]:
    answer = gateway.api("GET", f"/api/v1/credentials?subject_sub={username}&status=all")
    assert answer.status == 200, answer.body
    items: list[dict[str, Any]] = answer.body["items"]
    return items


def test_connecting_an_account_at_the_provider(
    oauth_gateway: Gateway, connect_app: OidcProvider,
    oauth_context: Callable[..., BrowserContext], screenshot: Screenshot,
) -> None:
    alice = oauth_gateway.create_user("alice")
    link = oauth_gateway.ask_to_connect(alice, MESSAGE, CONNECTION_TYPE)
    page = open_connect_page(oauth_context(), oauth_gateway, alice, link)

    # Which app asks, which account, where the user will sign in, which permissions.
    host = urlsplit(connect_app.issuer).netloc
    expect(page.get_by_role("heading", level=1)).to_have_text(
        f"{oauth_gateway.client_name} asks for access to your Example account")
    expect(page.get_by_text(MESSAGE)).to_be_visible()
    expect(page.locator("dt:text-is('Account to connect') + dd")).to_have_text("Example account")
    expect(page.locator("dt:text-is('You sign in at') + dd")).to_have_text(host)
    expect(page.locator("ul.scopes li")).to_have_text(SCOPES)
    expect(page.locator("input:not([type=hidden])")).to_have_count(0)
    screenshot(page, "connect")
    assert oauth_gateway.status_of(link["id"]) == "opened"

    authorize = press_connect(page, connect_app)
    query = parse_qs(urlsplit(authorize).query)
    assert query["client_id"] == [connect_app.connect_client_id]
    assert query["redirect_uri"] == [oauth_gateway.url(REDIRECT_PATH)]
    assert query["scope"] == [" ".join(SCOPES)]
    assert query["code_challenge_method"] == ["S256"]
    assert {"state", "nonce", "code_challenge"} <= query.keys()
    assert link["id"] not in authorize  # the provider learns nothing of the link

    sign_in_at_provider(page, connect_app, "alice")
    expect(page.get_by_role("heading", level=1)).to_have_text(
        f"Allow {connect_app.connect_client_id} to access your account?")
    with page.expect_navigation(url=re.compile(re.escape(oauth_gateway.url(REDIRECT_PATH)))):
        page.get_by_role("button", name="Allow").click()

    # Back at the gateway: connected, as the account the provider named.
    expect(page.get_by_role("heading", level=1)).to_have_text("Connected")
    expect(page.get_by_role("main")).to_contain_text("Your Example account alice is connected.")
    expect(page.locator("main strong")).to_have_text("alice")
    expect(page.locator("ul.scopes li")).to_have_text(SCOPES)
    assert oauth_gateway.status_of(link["id"]) == "completed"
    [credential] = credentials_of(oauth_gateway, alice)
    assert credential["type"] == CONNECTION_TYPE
    assert credential["status"] == "active"
    assert credential["elicitation_id"] == link["id"]
    assert credential["subject"] == {"iss": oauth_gateway.origin, "sub": alice}
    assert connect_app.connect_stats()["token_calls"]["authorization_code"] == 1
    # No token reaches the browser.
    assert "access_token" not in page.content()


def test_alices_provider_url_finished_in_bobs_browser_stores_nothing(
    oauth_gateway: Gateway, connect_app: OidcProvider,
    oauth_context: Callable[..., BrowserContext],
) -> None:
    alice, bob = oauth_gateway.create_users("alice", "bob")
    link = oauth_gateway.ask_to_connect(alice, MESSAGE, CONNECTION_TYPE)
    alices = open_connect_page(oauth_context(), oauth_gateway, alice, link)
    authorize = press_connect(alices, connect_app)

    # Alice's provider URL reaches Bob, who is logged in at the gateway as himself.
    bobs = oauth_context().new_page()
    bobs.goto(oauth_gateway.url("/login"))
    log_in(bobs, bob)
    bobs.goto(authorize)
    sign_in_at_provider(bobs, connect_app, "bob")
    with bobs.expect_navigation(
            url=re.compile(re.escape(oauth_gateway.url(REDIRECT_PATH)))) as back:
        bobs.get_by_role("button", name="Allow").click()
    assert back.value is not None
    assert back.value.status == 403
    expect(bobs.get_by_role("heading", level=1)).to_have_text("This link is for another account")
    expect(bobs.get_by_role("main")).to_contain_text("created for another account")
    assert alice not in bobs.content()  # the intended account is not named

    # Nothing stored, the code never exchanged, the link still Alice's to finish.
    assert credentials_of(oauth_gateway, alice) == []
    assert credentials_of(oauth_gateway, bob) == []
    assert oauth_gateway.status_of(link["id"]) == "opened"
    assert connect_app.connect_stats()["token_calls"]["authorization_code"] == 0
    [refusal] = oauth_gateway.run("audit", "--json", "--target", link["id"],
                                  "--action", "identity_mismatch")
    assert refusal["outcome"] == "denied"
    assert bob in refusal["actor"]

    # Alice, in her own browser, still connects.
    sign_in_at_provider(alices, connect_app, "alice")
    alices.get_by_role("button", name="Allow").click()
    expect(alices.get_by_role("heading", level=1)).to_have_text("Connected")
    assert oauth_gateway.status_of(link["id"]) == "completed"
    [credential] = credentials_of(oauth_gateway, alice)
    assert credential["elicitation_id"] == link["id"]


def test_denying_at_the_provider_declines(
    oauth_gateway: Gateway, connect_app: OidcProvider,
    oauth_context: Callable[..., BrowserContext],
) -> None:
    alice = oauth_gateway.create_user("alice")
    link = oauth_gateway.ask_to_connect(alice, MESSAGE, CONNECTION_TYPE)
    page = open_connect_page(oauth_context(), oauth_gateway, alice, link)
    press_connect(page, connect_app)
    sign_in_at_provider(page, connect_app, "alice")
    with page.expect_navigation(url=re.compile(re.escape(oauth_gateway.url(REDIRECT_PATH)))):
        page.get_by_role("link", name="Deny").click()

    expect(page.get_by_role("heading", level=1)).to_have_text("Declined")
    expect(page.get_by_text("You declined this request. Nothing was stored.")).to_be_visible()
    assert "error=access_denied" in page.url
    assert oauth_gateway.status_of(link["id"]) == "declined"
    assert credentials_of(oauth_gateway, alice) == []
    assert connect_app.connect_stats()["token_calls"]["authorization_code"] == 0


@pytest.mark.backend_independent
def test_the_watch_lets_through_only_the_named_loopback_origin() -> None:
    watch = Watch("localhost:8443")
    for origin in ("https://provider.example", "http://10.0.0.1:9000", "http://127.0.0.1",
                   "http://127.0.0.1:9000/auth", "http://127.0.0.1.example:9000"):
        with pytest.raises(ValueError, match="not the origin of a server on loopback"):
            watch.allow_local_server(origin)
    watch.allow_local_server("http://127.0.0.1:9000")

    def visit(url: str) -> None:
        watch.request(cast(Request, SimpleNamespace(url=url)))

    visit("https://localhost:8443/e/el_x")
    visit("http://127.0.0.1:9000/auth?state=x")
    assert watch.problems == []
    for url in ("http://127.0.0.1:9001/", "https://127.0.0.1:9000/", "http://localhost:9000/",
                "https://provider.example/"):
        visit(url)
    assert len(watch.problems) == 4, watch.problems
