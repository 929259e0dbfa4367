"""The portal's flows in Chromium, against the real server, as users and MCP servers see them."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.browser.conftest import Gateway, Screenshot, log_in

pytestmark = pytest.mark.slow


def new_key() -> str:
    """A key no other test uses, so finding it proves where it came from."""
    return f"wx-live-{secrets.token_hex(12)}"


def open_logged_in(context: BrowserContext, gateway: Gateway, username: str) -> Page:
    """A page of ``context`` after logging in through the form."""
    page = context.new_page()
    page.goto(gateway.url("/login"))
    log_in(page, username)
    expect(page).to_have_url(gateway.url("/"))
    return page


def save_key(page: Page, key: str) -> None:
    page.get_by_label("API key").fill(key)
    with page.expect_navigation():
        page.get_by_role("button", name="Save key").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Done")


def test_phishing_scenario_end_to_end(
    gateway: Gateway, new_context: Callable[..., BrowserContext], screenshot: Screenshot,
) -> None:
    alice, bob = gateway.create_users("alice", "bob")
    link = gateway.ask_for_key(alice, "Connect your weather API key")
    assert link["url"] == gateway.url(f"/e/{link['id']}")

    # Alice forwards her link to Bob, who is logged in with his own account.
    bobs = open_logged_in(new_context(), gateway, bob)
    refused = bobs.goto(link["url"])
    assert refused is not None
    assert refused.status == 403
    expect(bobs.get_by_role("heading", level=1)).to_have_text(
        "This link is for another account")
    expect(bobs.get_by_role("main")).to_contain_text(
        re.compile(r"created for (another|a different) account"))
    expect(bobs.locator("input[name=secret]")).to_have_count(0)
    expect(bobs.get_by_role("button", name="Save key")).to_have_count(0)
    assert alice not in bobs.content()  # the intended account is not named
    screenshot(bobs, "wrong-account")
    assert gateway.status_of(link["id"]) == "pending"

    # Alice opens it herself: to the login form, and back to the link. She is in
    # Berlin, so the page shows her own time beside UTC.
    alices = new_context(timezone_id="Europe/Berlin", locale="en-GB").new_page()
    alices.goto(link["url"])
    expect(alices).to_have_url(re.compile(r"/login\?next=%2Fe%2F" + link["id"] + "$"))
    screenshot(alices, "login")
    log_in(alices, alice)
    expect(alices).to_have_url(link["url"])
    expect(alices.get_by_role("heading", level=1)).to_have_text(
        f"{gateway.client_name} asks for your API key")
    expect(alices.get_by_text("Connect your weather API key")).to_be_visible()
    assert gateway.status_of(link["id"]) == "opened"

    # The show/hide toggle is a script file with the CSP nonce; it must run.
    field = alices.get_by_label("API key")
    toggle = alices.get_by_role("button", name="Show key")
    expect(toggle).to_be_visible()  # hidden until the script shows it
    expect(field).to_have_attribute("type", "password")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    key = new_key()
    field.fill(key)
    toggle.click()
    expect(field).to_have_attribute("type", "text")
    hide = alices.get_by_role("button", name="Hide key")
    expect(hide).to_have_attribute("aria-pressed", "true")
    expect(field).to_be_focused()
    expect(field).to_have_value(key)
    hide.click()
    expect(field).to_have_attribute("type", "password")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    screenshot(alices, "api-key")  # the key hidden again: the picture shows dots

    with alices.expect_navigation():
        alices.get_by_role("button", name="Save key").click()
    expect(alices.get_by_role("heading", level=1)).to_have_text("Done")
    expect(alices.get_by_text(f"You can go back to {gateway.client_name} now.")).to_be_visible()
    assert key not in alices.content()
    screenshot(alices, "done")

    # The MCP server finds the key and reveals exactly what Alice typed.
    assert gateway.status_of(link["id"]) == "completed"
    listed = gateway.api("GET", f"/api/v1/credentials?subject_sub={alice}&type=generic")
    [credential] = listed.body["items"]
    assert credential["elicitation_id"] == link["id"]
    assert credential["hint"] == "…" + key[-4:]
    revealed = gateway.api("POST", f"/api/v1/credentials/{credential['id']}/reveal")
    assert revealed.status == 200
    assert revealed.body["secret"] == key
    # Bob's account got nothing.
    assert gateway.api("GET", f"/api/v1/credentials?subject_sub={bob}").body["items"] == []


def test_declining_in_the_browser(
    gateway: Gateway, new_context: Callable[..., BrowserContext], screenshot: Screenshot,
) -> None:
    alice = gateway.create_user("alice")
    link = gateway.ask_for_key(alice, "Connect your weather API key")
    page = open_logged_in(new_context(), gateway, alice)
    page.goto(link["url"])
    with page.expect_navigation():
        page.get_by_role("button", name="Decline: I do not want to give this").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Declined")
    expect(page.get_by_text("You declined this request. Nothing was stored.")).to_be_visible()
    screenshot(page, "declined")
    assert gateway.status_of(link["id"]) == "declined"
    assert gateway.api("GET", f"/api/v1/credentials?subject_sub={alice}&status=all"
                       ).body["items"] == []


def test_account_lists_the_key_and_revokes_it(
    gateway: Gateway, new_context: Callable[..., BrowserContext], screenshot: Screenshot,
) -> None:
    alice = gateway.create_user("alice")
    link = gateway.ask_for_key(alice, "Connect your weather API key")
    context = new_context()
    page = open_logged_in(context, gateway, alice)
    page.goto(link["url"])
    key = new_key()
    save_key(page, key)
    [credential] = gateway.api("GET", f"/api/v1/credentials?subject_sub={alice}").body["items"]
    hint = "…" + key[-4:]

    page.goto(gateway.url("/account"))
    row = page.get_by_role("row").filter(has_text=gateway.client_name)
    expect(row).to_have_count(1)
    expect(row.locator("code")).to_have_text(hint)
    assert key not in page.content()
    revoke = page.get_by_role("button", name=re.compile(f"^Revoke the .* ending {hint} for "
                                                        f"{re.escape(gateway.client_name)}$"))
    expect(revoke).to_be_visible()
    screenshot(page, "account")

    # The same form with a forged CSRF token, and the same cookies, is refused.
    page.locator("form[action$='/revoke'] input[name=csrf_token]").evaluate(
        "field => { field.value = 'forged.token' }")
    with page.expect_navigation() as forged:
        revoke.click()
    assert forged.value is not None
    assert forged.value.status == 400
    assert gateway.api("POST", f"/api/v1/credentials/{credential['id']}/reveal").status == 200

    page.goto(gateway.url("/account"))
    with page.expect_navigation():
        revoke.click()
    expect(page).to_have_url(gateway.url("/account?revoked=1"))
    expect(page.get_by_role("status")).to_have_text("The key was revoked.")
    expect(page.get_by_text("You have no stored keys.")).to_be_visible()
    assert gateway.api("POST", f"/api/v1/credentials/{credential['id']}/reveal").status == 409


def test_a_link_whose_time_has_passed_accepts_nothing(
    gateway: Gateway, new_context: Callable[..., BrowserContext], screenshot: Screenshot,
) -> None:
    alice = gateway.create_user("alice")
    link = gateway.ask_for_key(alice, "Connect your weather API key")
    page = open_logged_in(new_context(), gateway, alice)
    gateway.run_out_of_time(link["id"])

    opened = page.goto(link["url"])
    assert opened is not None
    assert opened.status == 200
    expect(page.get_by_role("heading", level=1)).to_have_text("This link has expired")
    expect(page.get_by_role("main")).to_contain_text("Go back to the app and start again")
    expect(page.locator("input[name=secret]")).to_have_count(0)
    expect(page.get_by_role("main").locator("form")).to_have_count(0)
    screenshot(page, "expired")
    assert gateway.status_of(link["id"]) == "expired"
