"""What every portal page shows around its content: the header, the account links,
the MCP server's message set apart, and when a link expires."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from gateway.app import create_app
from gateway.clock import FixedClock
from gateway.settings import Settings
from tests.conftest import client_for
from tests.integration.portal.conftest import Browser

KEY = "wx-live-7f3a9c2e5b1d4a6f8e0c"
LOGOUT_FORM = re.compile(r'<form [^>]*method="post" action="/logout">\s*'
                         r'<input type="hidden" name="csrf_token" value="[^"]+">')


@pytest.fixture
def alices(browser: Callable[[], Browser], alice: str) -> Browser:
    logged_in = browser()
    logged_in.log_in(alice)
    return logged_in


def header_of(page: str) -> str:
    found = re.search(r'<header class="site">(.*?)</header>', page, re.DOTALL)
    assert found, "the page has no header"
    return found.group(1)


def test_every_signed_in_page_links_to_your_keys_and_can_log_out(
    alices: Browser, link_for: Callable[..., dict[str, Any]], bob: str,
) -> None:
    link, bobs_link = link_for("alice"), link_for(bob)
    pages = {
        "request": alices.get(f"/e/{link['id']}"),
        "another's link": alices.get(f"/e/{bobs_link['id']}"),
        "done": alices.post_form(f"/e/{link['id']}", {"action": "submit", "secret": KEY}),
        "account": alices.get("/account"),
        "start": alices.get("/"),
        "not found": alices.get("/e/el_nosuchlinkatallhere000000"),
        "log out": alices.get("/logout"),
    }
    for name, response in pages.items():
        page = response.get_data(as_text=True)
        assert '<a href="/account"' in header_of(page), name
        # One log-out button per page: the header's, or the page's own where that is its point.
        assert len(LOGOUT_FORM.findall(page)) == 1, name
    assert 'aria-current="page">Your keys' in header_of(pages["account"].get_data(as_text=True))


def test_pages_for_someone_not_signed_in_have_no_account_links(
    browser: Callable[[], Browser],
) -> None:
    visitor = browser()
    for path in ("/", "/login", "/logout"):
        header = header_of(visitor.get(path).get_data(as_text=True))
        assert "/account" not in header, path
        assert "/logout" not in header, path


def test_the_done_page_says_where_the_key_can_be_revoked(
    alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    link = link_for("alice")
    done = alices.post_form(f"/e/{link['id']}", {"action": "submit", "secret": KEY})
    assert ('You can revoke this key at any time on <a href="/account">Your keys</a>.'
            in done.get_data(as_text=True))
    declined = alices.post_form(f"/e/{link_for('alice')['id']}", {"action": "decline"})
    assert "revoke" not in declined.get_data(as_text=True)


def test_the_servers_message_is_quoted_as_its_own_and_stays_text(
    alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    link = link_for("alice", message='<a href="https://evil.example">Log in again</a> here')
    page = alices.get(f"/e/{link['id']}").get_data(as_text=True)
    block = re.search(r'<section class="app-message"[^>]*>(.*?)</section>', page, re.DOTALL)
    assert block, "no message block"
    assert "<h2 id=\"app-message-heading\">Message from mcp-server-1</h2>" in block.group(1)
    assert ("<blockquote>&lt;a href=&#34;https://evil.example&#34;&gt;Log in again&lt;/a&gt; "
            "here</blockquote>") in block.group(1)
    assert "https://evil.example" not in page.replace(block.group(1), "")
    assert '<a href="https://evil.example"' not in page


def test_the_header_draws_its_lock_and_names_the_host(
    alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    header = header_of(alices.get(f"/e/{link_for('alice')['id']}").get_data(as_text=True))
    assert '<svg class="lock"' in header
    assert 'aria-hidden="true"' in header
    assert "\U0001f512" not in header
    assert "&#x1F512;" not in header
    assert '<span class="host">gateway.test</span>' in header


@pytest.fixture
def app_on_port_8443(make_settings: Callable[..., Settings],
                     clock: FixedClock) -> Iterator[Flask]:
    application = create_app(make_settings(GATEWAY_PUBLIC_URL="https://gateway.test:8443"),
                             clock=clock)
    yield application
    application.extensions["gateway.engine"].dispose()


def test_a_host_on_another_port_than_443_is_shown_with_it(app_on_port_8443: Flask) -> None:
    page = client_for(app_on_port_8443, "https://gateway.test:8443").get("/")
    text = page.get_data(as_text=True)
    assert '<span class="host">gateway.test:8443</span>' in header_of(text)
    assert "<strong>gateway.test:8443</strong>" in text
    assert "<title>Secure entry portal · gateway.test:8443</title>" in text


def test_the_expiry_is_utc_in_a_time_element_with_a_script_for_local_time(
    alices: Browser, link_for: Callable[..., dict[str, Any]], clock: FixedClock,
) -> None:
    link = link_for("alice", ttl_seconds=900)
    page = alices.get(f"/e/{link['id']}").get_data(as_text=True)
    expires_at = clock.now() + timedelta(seconds=900)
    assert (f'<time datetime="{link["expires_at"]}" data-local-time>{expires_at:%H:%M} UTC</time>'
            " (in 15 minutes)") in page
    assert re.search(r'<script nonce="[^"]+" src="/static/localtime.js" defer></script>', page)


SCRIPT = re.compile(r'<script nonce="[^"]+" src="/static/([a-z]+\.js)"')


def test_only_the_pages_docs_security_md_names_carry_scripts(
    alices: Browser, link_for: Callable[..., dict[str, Any]], bob: str,
) -> None:
    # docs/security.md, "Headers": the request page of an API key carries
    # reveal.js and localtime.js; an OAuth connect page localtime.js alone
    # (the same template, elicitation.html); the payment page and every
    # other page none, under script-src 'none'.
    link, bobs_link = link_for("alice"), link_for(bob)
    request_page = alices.get(f"/e/{link['id']}").get_data(as_text=True)
    assert SCRIPT.findall(request_page) == ["localtime.js", "reveal.js"]
    others = {
        "another's link": alices.get(f"/e/{bobs_link['id']}"),
        "done": alices.post_form(f"/e/{link['id']}", {"action": "submit", "secret": KEY}),
        "account": alices.get("/account"),
        "start": alices.get("/"),
        "not found": alices.get("/e/el_nosuchlinkatallhere000000"),
        "log out": alices.get("/logout"),
        "login": Browser(client_for(alices.client.application)).get("/login"),
    }
    for name, response in others.items():
        assert "<script" not in response.get_data(as_text=True), name
        assert "script-src 'none'" in response.headers["Content-Security-Policy"], name
    templates = Path(alices.client.application.template_folder or "")
    scripted = {path.name: sorted(set(re.findall(r"static_url\('([a-z]+\.js)'\)",
                                                   path.read_text())))
                for path in templates.glob("*.html") if ".js'" in path.read_text()}
    assert scripted == {"_portal.html": ["localtime.js"],
                        "elicitation_api_key.html": ["reveal.js"]}
    # localtime.js comes with the expiry, which only elicitation.html shows.
    assert [path.name for path in templates.glob("*.html")
            if "expiry(" in path.read_text() and path.name != "_portal.html"] == [
        "elicitation.html"]


def test_the_article_before_a_key_follows_its_sound(
    alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    link = link_for("alice", credential_type="openai")
    page = alices.get(f"/e/{link['id']}").get_data(as_text=True)
    assert "Where to get\nan OpenAI API key (opens a new tab)" in page
    assert "<h1>mcp-server-1 asks for your OpenAI API key</h1>" in page
