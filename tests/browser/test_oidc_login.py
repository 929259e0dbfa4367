"""A full OpenID Connect login in Chromium, at the real provider, and back to the link."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect

from tests.browser.conftest import TIMEOUT_MS, Gateway, serve_alongside
from tests.oidc.fixtures import OidcProvider

KEY = "oidc-browser-key-7c1e9b"


@pytest.fixture(scope="module")
def oidc_gateway(gateway: Gateway, oidc_provider: OidcProvider) -> Iterator[Gateway]:
    """A second ``gateway serve`` on the same database, logging users in at the provider."""
    settings = {"GATEWAY_LOGIN_BACKEND": "oidc", "GATEWAY_OIDC_ISSUER": oidc_provider.issuer,
                "GATEWAY_OIDC_CLIENT_ID": oidc_provider.client_id,
                "GATEWAY_OIDC_CLIENT_SECRET": oidc_provider.client_secret}
    with serve_alongside(gateway, "oidc", settings,
                         also_reach=[urlsplit(oidc_provider.issuer).netloc]) as server:
        oidc_provider.add_redirect_uri(server.url("/login/callback"))
        yield server


@pytest.fixture
def oidc_page(browser: Browser) -> Iterator[Page]:
    """A page in a fresh context; its console must show no CSP violation or error."""
    context = browser.new_context(ignore_https_errors=False)
    context.set_default_timeout(TIMEOUT_MS)
    problems: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text or (
                message.type == "error" and "Failed to load resource" not in message.text):
            problems.append(message.text)

    context.on("console", console)
    yield context.new_page()
    context.close()
    assert problems == []


def test_a_user_logs_in_at_the_provider_and_completes_their_link(
    oidc_gateway: Gateway, oidc_provider: OidcProvider, oidc_page: Page,
) -> None:
    created = oidc_gateway.api("POST", "/api/v1/elicitations", {
        "subject": {"iss": oidc_provider.issuer, "sub": "alice"}, "kind": "api_key",
        "credential_type": "generic", "message": "Connect your key", "reuse_pending": False})
    assert created.status == 201, created.body
    link = created.body["url"]
    assert link.startswith(oidc_gateway.origin)

    oidc_page.goto(link)
    # Sent to the provider's own login page, over there.
    expect(oidc_page.locator("input[name=login]")).to_be_visible()
    assert oidc_page.url.startswith(oidc_provider.issuer)
    oidc_page.locator("input[name=login]").fill("alice")
    oidc_page.locator("input[name=password]").fill(oidc_provider.password)
    oidc_page.get_by_role("button", name="Sign in").click()

    # Back on the gateway, on the link it started from, as alice.
    expect(oidc_page.get_by_label("API key")).to_be_visible()
    assert oidc_page.url == link
    expect(oidc_page.get_by_text("alice", exact=True)).to_be_visible()
    oidc_page.get_by_label("API key").fill(KEY)
    oidc_page.get_by_role("button", name="Save key").click()
    expect(oidc_page.get_by_role("heading", name="Done")).to_be_visible()

    assert oidc_gateway.status_of(created.body["id"]) == "completed"
    listed = oidc_gateway.api("GET", "/api/v1/credentials?subject_sub=alice")
    [credential] = [c for c in listed.body["items"]
                    if c["elicitation_id"] == created.body["id"]]
    revealed = oidc_gateway.api("POST", f"/api/v1/credentials/{credential['id']}/reveal")
    assert revealed.body["secret"] == KEY
