"""Accessibility, layout and page hygiene of every portal page, measured in Chromium.

Each test walks the same tour of pages (login, a failed login, the request
page, another account's link, the done page, the account page, an unknown
link, the start page, log out) and checks one property on each page it
reaches. The connection pages (connect, connected) have a tour of their
own on the OAuth gateway, through the test provider, with the same checks.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Page, Response, expect

from tests.browser.conftest import CONNECTION_TYPE, PASSWORD, Gateway, Watch, log_in
from tests.oidc.fixtures import OidcProvider

pytestmark = pytest.mark.slow

DESKTOP = {"width": 1280, "height": 800}
MOBILE = {"width": 360, "height": 740}

# A check runs on one page: (the page's name, the page, its HTTP response).
Check = Callable[[str, Page, Response], None]


@pytest.fixture(scope="module")
def people(gateway: Gateway) -> tuple[str, str]:
    """Two accounts every test here may use (each test makes its own requests)."""
    alice, bob = gateway.create_users("alice", "bob")
    return alice, bob


def visitor(page: Page, check: Check, seen: list[str]) -> Callable[..., None]:
    """``at(name, response, status=200)``: the page has arrived; check it and note its name."""

    def at(name: str, response: Response | None, status: int = 200) -> None:
        assert response is not None, f"no response for the {name} page"
        assert response.status == status, f"{name}: {response.status} at {response.url}"
        seen.append(name)
        check(name, page, response)

    return at


@dataclass
class Tour:
    gateway: Gateway
    people: tuple[str, str]
    context: BrowserContext

    def walk(self, check: Check) -> list[str]:
        """Visit every page a user of the portal can reach; ``check`` each. The names seen."""
        gateway, seen = self.gateway, []
        user, other = self.people
        link = gateway.ask_for_key(user, "Connect your weather API key so that forecasts "
                                         "for your saved places can be fetched every hour.")
        others = gateway.ask_for_key(other, "Connect your weather API key")
        page = self.context.new_page()
        at = visitor(page, check, seen)

        at("login", page.goto(link["url"]))
        with page.expect_navigation() as failed:
            log_in_without_waiting(page, user, "not the password")
        at("login-failed", failed.value, 401)
        with page.expect_navigation() as arrived:
            log_in_without_waiting(page, user, PASSWORD)
        at("elicitation", arrived.value)
        at("wrong-account", page.goto(others["url"]), 403)
        page.goto(link["url"])
        page.get_by_label("API key").fill(f"wx-live-{secrets.token_hex(12)}")
        with page.expect_navigation() as done:
            page.get_by_role("button", name="Save key").click()
        at("done", done.value)
        at("account", page.goto(gateway.url("/account")))
        at("not-found", page.goto(gateway.url("/e/el_nosuchlinkatallhere000000")), 404)
        at("index", page.goto(gateway.url("/")))
        at("logout", page.goto(gateway.url("/logout")))
        with page.expect_navigation() as logged_out:
            page.get_by_role("button", name="Log out").click()
        at("logged-out", logged_out.value)
        return seen


def log_in_without_waiting(page: Page, username: str, password: str) -> None:
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()


ALL_PAGES = ["login", "login-failed", "elicitation", "wrong-account", "done", "account",
             "not-found", "index", "logout", "logged-out"]


@pytest.fixture
def tour(gateway: Gateway, people: tuple[str, str],
         new_context: Callable[..., BrowserContext]) -> Callable[..., Tour]:
    return lambda **options: Tour(gateway, people, new_context(**options))


@dataclass
class ConnectionTour:
    gateway: Gateway
    provider: OidcProvider
    people: tuple[str, str]
    context: BrowserContext

    def walk(self, check: Check) -> list[str]:
        """Connect an account, checking the gateway's pages on the way (not the provider's)."""
        gateway, seen = self.gateway, []
        user, _ = self.people
        link = gateway.ask_to_connect(user, "Connect your Example account so that storm "
                                            "warnings can be filed as issues.", CONNECTION_TYPE)
        page = self.context.new_page()
        at = visitor(page, check, seen)
        page.goto(link["url"])
        with page.expect_navigation() as arrived:
            log_in_without_waiting(page, user, PASSWORD)
        at("connect", arrived.value)
        page.get_by_role("button", name=re.compile(r"^Connect at ")).click()
        page.locator("input[name=login]").fill("alice")
        page.locator("input[name=password]").fill(self.provider.password)
        page.get_by_role("button", name="Sign in").click()
        callback = re.compile(re.escape(gateway.url(f"/oauth/callback/{CONNECTION_TYPE}")))
        with page.expect_navigation(url=callback) as back:
            page.get_by_role("button", name="Allow").click()
        at("connected", back.value)
        return seen


CONNECTION_PAGES = ["connect", "connected"]


@pytest.fixture
def connection_tour(oauth_gateway: Gateway, connect_app: OidcProvider, people: tuple[str, str],
                    oauth_context: Callable[..., BrowserContext]) -> Callable[..., ConnectionTour]:
    return lambda **options: ConnectionTour(oauth_gateway, connect_app, people,
                                            oauth_context(**options))


# --- labels and keyboard ------------------------------------------------------------------


def assert_every_control_is_labelled(name: str, page: Page) -> None:
    """Each visible form field is found by its label's text; each button has a name."""
    fields = page.locator("input:not([type=hidden]), select, textarea")
    for index in range(fields.count()):
        field = fields.nth(index)
        ident = field.get_attribute("id")
        assert ident, f"{name}: a form field without an id cannot have a <label for>"
        labels = page.locator(f"label[for='{ident}']")
        expect(labels).to_have_count(1)
        text = labels.inner_text().strip()
        assert text, f"{name}: the label of #{ident} is empty"
        expect(page.get_by_label(text, exact=True)).to_have_id(ident)
    buttons = page.locator("button:visible")
    for index in range(buttons.count()):
        expect(buttons.nth(index)).to_have_accessible_name(re.compile(r"\w"))


def labelled(name: str, page: Page, response: Response) -> None:
    """Check: every control is labelled, and the ones that matter have the right label."""
    assert_every_control_is_labelled(name, page)
    if name.startswith("login"):
        expect(page.get_by_label("User name")).to_have_id("username")
        expect(page.get_by_label("Password")).to_have_id("password")
    elif name == "elicitation":
        expect(page.get_by_label("API key")).to_have_id("secret")
        expect(page.get_by_role("button", name="Show key")).to_be_visible()
    elif name == "account":
        expect(page.get_by_role("button", name=re.compile(
            r"^Revoke the API key ending …\w{4} for "))).to_have_text("Revoke")
    elif name == "connect":
        expect(page.get_by_role("button", name=re.compile(r"^Connect at \S+$"))).to_be_visible()


def test_every_field_and_button_has_a_programmatic_label(tour: Callable[..., Tour]) -> None:
    assert tour().walk(labelled) == ALL_PAGES


def focus_sequence(page: Page, stops: int) -> list[str]:
    """What Tab reaches, from the top of the page: ids, or a button's or link's text."""
    page.locator("header.site").click()  # a start before everything focusable
    reached = []
    for _ in range(stops):
        page.keyboard.press("Tab")
        reached.append(page.evaluate(
            "() => { const e = document.activeElement;"
            " return e.id || (e.textContent || '').trim() || e.tagName; }"))
    return reached


def test_keyboard_reaches_the_login_form_in_order(gateway: Gateway, page: Page) -> None:
    page.goto(gateway.url("/login"))
    expect(page.get_by_label("User name")).to_be_focused()
    assert focus_sequence(page, 3) == ["username", "password", "Log in"]


def test_the_secret_field_comes_first_on_the_request_page(
    gateway: Gateway, people: tuple[str, str], page: Page,
) -> None:
    user, _ = people
    link = gateway.ask_for_key(user, "Connect your weather API key")
    page.goto(link["url"])
    log_in(page, user)
    expect(page.get_by_label("API key")).to_be_focused()
    # From the top: the header's account links, then the form in the order it reads.
    assert focus_sequence(page, 6) == [
        "Your keys", "Log out",
        "secret", "toggle-secret", "Save key", "Decline: I do not want to give this"]


# --- contrast ----------------------------------------------------------------------------

# Colours of every visible text element and button, against the first opaque
# background behind it (its own, or an ancestor's).
COLOURS = """() => {
  const rgba = value => {
    const m = value.match(/^rgba?\\(([^)]*)\\)$/);
    if (!m) { return null; }
    const parts = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return {rgb: parts.slice(0, 3), alpha: parts.length > 3 ? parts[3] : 1};
  };
  const background = element => {
    for (let e = element; e; e = e.parentElement) {
      const colour = rgba(getComputedStyle(e).backgroundColor);
      if (colour && colour.alpha > 0) { return colour; }
    }
    return {rgb: [255, 255, 255], alpha: 1};
  };
  const found = [];
  const texts = "h1, h2, p, label, dt, dd, th, td, a, button, code, time, strong, li, " +
                "caption, header.site span";
  for (const element of document.querySelectorAll(texts)) {
    const box = element.getBoundingClientRect();
    if (!box.width || !box.height || !element.textContent.trim()) { continue; }
    if (element.closest(".visually-hidden, [aria-hidden=true]")) { continue; }
    const style = getComputedStyle(element);
    found.push({what: element.tagName.toLowerCase() + " " + element.textContent.trim().slice(0, 30),
                colour: style.color, fg: rgba(style.color), bg: background(element)});
  }
  return found;
}"""


def luminance(rgb: list[float]) -> float:
    """Relative luminance (WCAG 2)."""
    def linear(channel: float) -> float:
        c = channel / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(first: list[float], second: list[float]) -> float:
    """The WCAG contrast ratio of two opaque colours, 1 to 21."""
    light, dark = sorted((luminance(first), luminance(second)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


@pytest.mark.backend_independent
def test_the_contrast_function_matches_known_ratios() -> None:
    assert contrast([0, 0, 0], [255, 255, 255]) == pytest.approx(21)
    assert contrast([118, 118, 118], [255, 255, 255]) == pytest.approx(4.54, abs=0.01)


def readable(name: str, page: Page, response: Response) -> None:
    """Check: text and buttons stand out from their background (WCAG AA, 4.5:1)."""
    items: list[dict[str, Any]] = page.evaluate(COLOURS)
    if name in ("login", "elicitation", "account", "logout", "connect"):
        assert any(item["what"].startswith("button") for item in items), name
    for item in items:
        assert item["fg"], f"{name}: cannot read the colour {item['colour']!r}"
        assert item["fg"]["alpha"] == 1, f"{name}: translucent text {item['what']!r}"
        ratio = contrast(item["fg"]["rgb"], item["bg"]["rgb"])
        assert ratio >= 4.5, f"{name}: {item['what']!r} has contrast {ratio:.2f}"


def test_text_and_buttons_have_enough_contrast(tour: Callable[..., Tour]) -> None:
    assert tour().walk(readable) == ALL_PAGES


def test_focus_outline_is_visible_against_the_page(
    gateway: Gateway, people: tuple[str, str], page: Page,
) -> None:
    """The keyboard focus ring must stand out: at least 3:1 against what surrounds it."""
    user, _ = people
    link = gateway.ask_for_key(user, "Connect your weather API key")
    page.goto(link["url"])
    log_in(page, user)
    page.locator("header.site").click()
    for _ in range(6):
        page.keyboard.press("Tab")
        ring = page.evaluate("""() => {
          const e = document.activeElement, s = getComputedStyle(e);
          const band = e.closest("header.site");
          return {what: e.id || e.textContent.trim(), style: s.outlineStyle,
                  width: parseFloat(s.outlineWidth), colour: s.outlineColor,
                  around: band ? getComputedStyle(band).backgroundColor : "rgb(255, 255, 255)"};
        }""")
        assert ring["style"] != "none", ring
        assert ring["width"] >= 2, ring
        rgb = [float(c) for c in re.findall(r"[\d.]+", ring["colour"])[:3]]
        # The ring sits on the dark header band (the account links) or the white card.
        around = [float(c) for c in re.findall(r"[\d.]+", ring["around"])[:3]]
        assert contrast(rgb, around) >= 3, ring


# --- layout ------------------------------------------------------------------------------


def fits(screenshots: Path, viewport: dict[str, int]) -> Check:
    """Check: no horizontal scrolling at ``viewport``; each page's picture kept for a look."""

    def check(name: str, page: Page, response: Response) -> None:
        page.screenshot(path=screenshots / f"{name}-{viewport['width']}.png", full_page=True)
        scroll = page.evaluate("() => { const s = document.scrollingElement;"
                               " return [s.scrollWidth, s.clientWidth]; }")
        assert scroll[0] <= scroll[1], f"{name}: {scroll[0]} px wide in a {scroll[1]} px view"

    return check


@pytest.mark.parametrize("viewport", [MOBILE, DESKTOP], ids=["360px", "1280px"])
def test_no_horizontal_scrolling_and_screenshots(
    tour: Callable[..., Tour], viewport: dict[str, int], screenshots: Path,
) -> None:
    assert tour(viewport=viewport).walk(fits(screenshots, viewport)) == ALL_PAGES


# --- what the pages load and contain -------------------------------------------------------


class InlineCode(HTMLParser):
    """Inline style and script in served HTML that the CSP would (or should) refuse."""

    def __init__(self, nonce: str | None) -> None:
        super().__init__()
        self.nonce = nonce
        self.found: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if "style" in attributes:
            self.found.append(f"<{tag} style=...>")
        self.found += [f"<{tag} {a}=...>" for a in attributes if a.startswith("on")]
        if tag == "style":
            self.found.append("<style>")
        if tag == "script":
            self.scripts += 1
            if self.nonce is None:
                self.found.append(f"<script> on a page whose policy allows none: {attributes}")
            elif attributes.get("nonce") != self.nonce:
                self.found.append(f"<script> without this response's nonce: {attributes}")
        if any((value or "").strip().lower().startswith("javascript:")
               for value in attributes.values()):
            self.found.append(f"<{tag}> with a javascript: URL")


# What each page loaded, as the page itself saw it (Resource Timing).
LOADED = "() => performance.getEntriesByType('resource').map(entry => entry.name)"


@dataclass
class Hygiene:
    """Check: no inline code, a script only with the CSP nonce, assets only from the gateway.

    Counts the scripts of each page it saw, in ``scripts``.
    """

    scripts: dict[str, int] = field(default_factory=dict)

    def __call__(self, name: str, page: Page, response: Response) -> None:
        policy = response.headers["content-security-policy"]
        # A page with a script allows exactly its nonce; any other, no script.
        nonce = re.search(r"script-src 'nonce-([^']+)'(;|$)", policy)
        assert nonce or "script-src 'none';" in policy, policy
        assert "unsafe-inline" not in policy
        assert response.headers["content-type"].startswith("text/html")
        parser = InlineCode(nonce.group(1) if nonce else None)
        parser.feed(response.text())
        assert parser.found == [], f"{name}: {parser.found}"
        self.scripts[name] = parser.scripts
        origin, loaded = page.evaluate("() => location.origin"), page.evaluate(LOADED)
        assert f"{origin}/static/gateway.css" in loaded, f"{name}: {loaded}"
        elsewhere = [url for url in loaded if not url.startswith(f"{origin}/")]
        assert elsewhere == [], f"{name}: {elsewhere}"


def test_pages_load_only_from_the_gateway_and_carry_no_inline_code(
    tour: Callable[..., Tour], watch: Watch,
) -> None:
    """No third-party asset; no inline style, and no script without the CSP nonce."""
    hygiene = Hygiene()
    tour().walk(hygiene)
    # The show/hide toggle and the expiry's local time, each with the nonce.
    assert hygiene.scripts["elicitation"] == 2
    assert any(url.endswith("/static/gateway.css") for url in watch.requests)
    assert any(url.endswith("/static/reveal.js") for url in watch.requests)
    assert any(url.endswith("/static/localtime.js") for url in watch.requests)
    elsewhere = [url for url in watch.requests if not url.startswith(f"https://{watch.host}/")]
    assert elsewhere == []


# --- the connection pages ------------------------------------------------------------------


@pytest.mark.parametrize("viewport", [MOBILE, DESKTOP], ids=["360px", "1280px"])
def test_the_connection_pages_pass_the_same_checks(
    connection_tour: Callable[..., ConnectionTour], viewport: dict[str, int], screenshots: Path,
) -> None:
    """Labels, contrast, layout and hygiene of the connect and connected pages.

    Every check runs on one walk per viewport, as each walk signs in at the provider.
    """
    hygiene = Hygiene()
    checks = [labelled, readable, fits(screenshots, viewport), hygiene]

    def check(name: str, page: Page, response: Response) -> None:
        for each in checks:
            each(name, page, response)

    assert connection_tour(viewport=viewport).walk(check) == CONNECTION_PAGES
    # The connect page's one script shows the expiry in local time, with the nonce.
    assert hygiene.scripts == {"connect": 1, "connected": 0}


def test_the_watch_catches_csp_violations(gateway: Gateway, page: Page, watch: Watch) -> None:
    """Injected inline style and script are refused by the CSP, and the watch reports it."""
    page.goto(gateway.url("/login"))
    refused = re.compile("Content Security Policy")
    with page.expect_console_message(lambda message: bool(refused.search(message.text))):
        page.locator("h1").evaluate("heading => heading.setAttribute('style', 'color: red')")
    with page.expect_console_message(lambda message: bool(refused.search(message.text))):
        page.evaluate("""() => {
          const script = document.createElement("script");
          script.textContent = "document.title = 'injected'";
          document.body.append(script);
        }""")
    expect(page).not_to_have_title("injected")
    expect(page.locator("h1")).not_to_have_css("color", "rgb(255, 0, 0)")
    page.evaluate("() => 1")  # a round trip: the watch has seen every message by now
    assert sum("CSP violation" in problem for problem in watch.problems) == 2, watch.problems
    watch.problems.clear()  # expected here; the test itself is clean
