"""The example weather server, end to end: a user's MCP client, the browser, the gateway.

The official SDK's client calls the example's tools over streamable HTTP
with alice's ID token, on both protocol versions: 2025-11-25 (``legacy``:
error -32042, then ``notifications/elicitation/complete`` through the
gateway's signed webhook) and 2026-07-28 (``InputRequiredResult`` and a
sealed ``requestState``). Chromium opens the link, signs in at the
provider and answers it.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable

import pytest
from playwright.sync_api import Page, Route, expect

from gateway.client import Subject
from tests.browser.stripe_stub import CHECKOUT_HOST
from tests.e2e.conftest import Gateway, WeatherServer, enter_key, sign_in
from tests.e2e.mcp_user import LEGACY, MODERN, ToolCall, text_of
from tests.oidc.fixtures import OidcProvider

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("mode", [LEGACY, MODERN])]


def new_key() -> str:
    return f"wx-live-{secrets.token_hex(12)}"


def test_the_forecast_uses_the_key_alice_entered_in_her_browser(
    mode: str, gateway: Gateway, weather: WeatherServer, oidc_provider: OidcProvider,
    token_of: Callable[[str], str], new_page: Callable[[], Page],
) -> None:
    call = ToolCall(weather.mcp_url, token_of("alice"), mode, "forecast", {"city": "Oslo"})
    link = call.next_link()
    assert link.mode == "url"
    assert link.url.startswith(f"{gateway.origin}/e/")
    assert link.message == "Connect your weather service API key to get forecasts."
    elicitation_id = weather.elicitation_id(link.url)
    # Only 2025-11-25 names the elicitation; 2026-07-28 carries it in the sealed state.
    assert link.elicitation_id == (elicitation_id if mode == LEGACY else None)

    key = new_key()
    page = new_page()
    page.goto(link.url)
    sign_in(page, oidc_provider, "alice")
    enter_key(page, link.url, key)

    assert text_of(call.result()) == (
        f"Tomorrow in Oslo: sunny, 21 °C (fetched with your key …{key[-4:]})")
    # Exactly that key, in alice's name, is what the example was given.
    alice = Subject(oidc_provider.issuer, "alice")
    stored = weather.gateway.find_credential(alice, "generic", elicitation_id=elicitation_id)
    assert stored is not None
    assert weather.gateway.reveal_credential(stored.id).secret == key
    if mode == LEGACY:
        # The gateway's webhook reached the example, which told the session that asked.
        assert call.completions == [elicitation_id]


def test_bob_cannot_answer_alices_link_and_her_call_waits_for_her(
    mode: str, gateway: Gateway, weather: WeatherServer, oidc_provider: OidcProvider,
    token_of: Callable[[str], str], new_page: Callable[[], Page],
) -> None:
    call = ToolCall(weather.mcp_url, token_of("alice"), mode, "forecast", {"city": "Bergen"})
    link = call.next_link()
    elicitation_id = weather.elicitation_id(link.url)

    # Alice forwards the link; Bob opens it and signs in as himself.
    bobs = new_page()
    bobs.goto(link.url)
    with bobs.expect_response(link.url) as back_on_the_link:
        sign_in(bobs, oidc_provider, "bob")
    assert back_on_the_link.value.status == 403
    expect(bobs.get_by_role("heading", level=1)).to_have_text("This link is for another account")
    expect(bobs.locator("input[name=secret]")).to_have_count(0)

    # Nothing was taken from Bob, and Alice's call is still waiting for her.
    assert weather.gateway.get_elicitation(elicitation_id).status == "pending"
    assert weather.gateway.list_credentials().items == []
    assert not call.done
    assert call.completions == []

    key = new_key()
    alices = new_page()
    alices.goto(link.url)
    sign_in(alices, oidc_provider, "alice")
    enter_key(alices, link.url, key)
    assert text_of(call.result()).endswith(f"(fetched with your key …{key[-4:]})")
    [stored] = weather.gateway.list_credentials().items
    assert stored.subject == Subject(oidc_provider.issuer, "alice")


def test_the_premium_forecast_is_paid_through_stripe_checkout(
    mode: str, gateway: Gateway, weather: WeatherServer, oidc_provider: OidcProvider,
    token_of: Callable[[str], str], new_page: Callable[[], Page],
) -> None:
    order = f"order-{secrets.token_hex(4)}"
    call = ToolCall(weather.mcp_url, token_of("alice"), mode, "premium_forecast",
                    {"city": "Tromsø", "order_id": order})
    link = call.next_link()
    assert link.message == "Pay 1.99 USD for a 14-day forecast."
    elicitation_id = weather.elicitation_id(link.url)

    page = new_page()
    page.goto(link.url)
    sign_in(page, oidc_provider, "alice")
    expect(page.get_by_role("heading", level=1)).to_have_text(
        f"{weather.name} asks for a payment")
    expect(page.get_by_role("main")).to_contain_text("14-day forecast for Tromsø")

    # Stripe's hosted page is answered here: the browser is sent there, nothing leaves.
    page.route(f"{CHECKOUT_HOST}/**", lambda route: _stripe_checkout_page(route))
    page.get_by_role("button", name="Pay 1.99 USD with Stripe").click()
    expect(page).to_have_url(re.compile(re.escape(f"{CHECKOUT_HOST}/c/pay/cs_test_")))
    [session] = [s for s in gateway.stripe.sessions.values()
                 if s["client_reference_id"] == elicitation_id]
    assert page.url == session["url"]
    assert (session["amount_total"], session["currency"]) == (199, "usd")
    assert weather.gateway.get_elicitation(elicitation_id).status == "opened"
    assert not call.done

    # Alice pays; Stripe reports it to the gateway, signed.
    paid = {**session, "status": "complete", "payment_status": "paid",
            "payment_intent": f"pi_test_{secrets.token_hex(8)}"}
    assert gateway.send_stripe_event("checkout.session.completed", paid)["outcome"] == "applied"

    assert text_of(call.result()) == (
        f"14 days in Tromsø: mostly sunny (order {order}, payment {elicitation_id})")
    if mode == LEGACY:
        assert call.completions == [elicitation_id]


def _stripe_checkout_page(route: Route) -> None:
    route.fulfill(status=200, content_type="text/html",
                  body="<!doctype html><title>Stripe Checkout</title><p>Checkout</p>")
