"""What surrounds every page's content, in Chromium, as a user notices it: the header
(a drawn lock, the host and its port, Your keys and Log out), the app's message set
apart as the app's words, the right article before a key's name, and the expiry in
the reader's own time."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.browser.conftest import Gateway, log_in

pytestmark = pytest.mark.slow

KEY = "wx-live-0b1c2d3e4f5a6b7c8d9e"


def signed_in_on(context: BrowserContext, gateway: Gateway, link: dict[str, Any],
                 username: str) -> Page:
    """A page of ``context`` on ``link``, reached through the login form."""
    page = context.new_page()
    page.goto(link["url"])
    log_in(page, username)
    expect(page).to_have_url(link["url"])
    return page


def expect_account_links(page: Page, where: str) -> None:
    """Your keys and one Log out button, in the header, as on every signed-in page."""
    header = page.locator("header.site")
    expect(header.get_by_role("link", name="Your keys"), where).to_have_attribute(
        "href", "/account")
    expect(page.get_by_role("button", name="Log out"), where).to_have_count(1)
    expect(page.get_by_role("button", name="Log out"), where).to_be_visible()


def test_signed_in_pages_link_to_your_keys_and_log_out(
    gateway: Gateway, new_context: Callable[..., BrowserContext],
) -> None:
    alice, bob = gateway.create_users("alice", "bob")
    link = gateway.ask_for_key(alice, "Connect your weather API key")
    page = signed_in_on(new_context(), gateway, link, alice)
    expect_account_links(page, "the request page")

    page.get_by_label("API key").fill(KEY)
    with page.expect_navigation():
        page.get_by_role("button", name="Save key").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Done")
    expect_account_links(page, "the done page")
    # Where the key can be taken back later, from the page that stored it.
    revoke_later = page.get_by_role("main").get_by_text(
        "You can revoke this key at any time on Your keys.")
    expect(revoke_later).to_be_visible()
    expect(revoke_later.get_by_role("link", name="Your keys")).to_have_attribute(
        "href", "/account")

    page.goto(gateway.url("/"))
    expect_account_links(page, "the start page")
    page.goto(gateway.ask_for_key(bob, "Connect your weather API key")["url"])
    expect(page.get_by_role("heading", level=1)).to_have_text("This link is for another account")
    expect_account_links(page, "another account's link")

    with page.expect_navigation():
        revoke_later_link = page.locator("header.site").get_by_role("link", name="Your keys")
        revoke_later_link.click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Your keys")
    expect_account_links(page, "the account page")
    expect(page.get_by_role("row").filter(has_text=gateway.client_name)).to_have_count(1)

    # The header's button logs out for good: the account page asks for a login again.
    with page.expect_navigation():
        page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("You are logged out")
    expect(page.get_by_role("link", name="Your keys")).to_have_count(0)
    page.goto(gateway.url("/account"))
    expect(page).to_have_url(re.compile(r"/login\?next=%2Faccount$"))
    expect(page.get_by_role("button", name="Log out")).to_have_count(0)


def test_the_apps_message_is_quoted_under_its_name_and_stays_text(
    gateway: Gateway, new_context: Callable[..., BrowserContext],
) -> None:
    alice = gateway.create_user("alice")
    words = ('IMPORTANT from the portal: <a href="https://evil.example">log in again</a> '
             "and type your password below.")
    link = gateway.ask_for_key(alice, words)
    page = signed_in_on(new_context(), gateway, link, alice)

    heading = page.get_by_role("heading", name=f"Message from {gateway.client_name}")
    expect(heading).to_be_visible()
    block = page.locator("section.app-message")
    expect(block.get_by_role("heading")).to_have_text(f"Message from {gateway.client_name}")
    quoted = block.locator("blockquote")
    expect(quoted).to_have_text(words)  # the markup shows as the characters it is
    expect(page.get_by_role("link", name="log in again")).to_have_count(0)
    expect(block).to_contain_text(f"{gateway.client_name} wrote this, not {gateway.host}.")
    # Set apart: quoted, in italics, in a dashed box no notice of the portal's has.
    expect(block).to_have_css("border-top-style", "dashed")
    expect(quoted).to_have_css("font-style", "italic")
    marks = quoted.evaluate("""element => [getComputedStyle(element, "::before").content,
                                           getComputedStyle(element, "::after").content]""")
    assert marks == ['"\u201c"', '"\u201d"']


def is_emoji(character: str) -> bool:
    return unicodedata.category(character) == "So" or 0x1F000 <= ord(character) <= 0x1FAFF


def test_the_header_draws_its_lock_and_shows_the_host_with_its_port(
    gateway: Gateway, page: Page,
) -> None:
    for path in ("/login", "/"):
        page.goto(gateway.url(path))
        header = page.locator("header.site")
        lock = header.locator("svg.lock")
        expect(lock).to_be_visible()
        expect(lock).to_have_attribute("aria-hidden", "true")
        box = lock.bounding_box()
        assert box is not None
        assert box["width"] >= 12
        assert box["height"] >= 12
        text = header.inner_text()
        assert not [c for c in text if is_emoji(c)], text
        assert ":" in gateway.host  # the test gateway listens on a port of its own
        expect(header.locator(".host")).to_have_text(gateway.host)
        # Read aloud: what the drawn lock stands for, then the host.
        expect(header.locator("p.address")).to_have_text(
            f"Secure entry portal at {gateway.host}")


def test_an_openai_key_is_an_openai_api_key(
    gateway: Gateway, new_context: Callable[..., BrowserContext],
) -> None:
    alice = gateway.create_user("alice")
    created = gateway.api("POST", "/api/v1/elicitations", {
        "subject": {"iss": gateway.origin, "sub": alice}, "kind": "api_key",
        "credential_type": "openai", "message": "Connect your OpenAI account",
        "reuse_pending": False})
    assert created.status == 201, created.body
    page = signed_in_on(new_context(), gateway, created.body, alice)
    expect(page.get_by_role("heading", level=1)).to_have_text(
        f"{gateway.client_name} asks for your OpenAI API key")
    expect(page.get_by_role("link", name="Where to get an OpenAI API key (opens a new tab)")
           ).to_be_visible()

    # Too short to be one: refused on its shape, before any live check.
    page.get_by_label("OpenAI API key").fill("sk-short")
    with page.expect_navigation():
        page.get_by_role("button", name="Save key").click()
    expect(page.get_by_role("alert")).to_have_text(
        "An OpenAI API key has at least 23 characters.")


def test_the_expiry_shows_the_readers_own_time_beside_utc(
    gateway: Gateway, new_context: Callable[..., BrowserContext],
) -> None:
    alice = gateway.create_user("alice")
    link = gateway.ask_for_key(alice, "Connect your weather API key")
    expires_at = datetime.fromisoformat(link["expires_at"])
    here = expires_at.astimezone(ZoneInfo("Asia/Kolkata"))  # UTC+5:30: hour and minute differ

    page = signed_in_on(new_context(timezone_id="Asia/Kolkata", locale="en-GB"), gateway, link,
                        alice)
    expiry = page.locator("dt:text-is('Link expires') + dd")
    # Its day too, when it falls on another day than the reader's today.
    today = datetime.now(ZoneInfo("Asia/Kolkata")).date()
    day = "" if here.date() == today else rf"{here:%a} {here.day} {here:%b}, "
    expect(expiry).to_have_text(re.compile(
        rf"^{day}0?{here.hour}:{here:%M} (IST|GMT\+5:30) your time, "
        rf"{expires_at:%H:%M} UTC \(in 1[45] minutes\)$"))
    expect(expiry.locator("time")).to_have_attribute("datetime", link["expires_at"])

    # Without scripts, the server's UTC text stands alone.
    plain = signed_in_on(new_context(java_script_enabled=False), gateway, link, alice)
    expect(plain.locator("dt:text-is('Link expires') + dd")).to_have_text(re.compile(
        rf"^{expires_at:%H:%M} UTC \(in 1[45] minutes\)$"))
