"""The payment page in Chromium: to Stripe's Checkout (answered locally) and back."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Page, Route, expect

from tests.browser.conftest import Gateway, Screenshot, Watch, log_in
from tests.browser.stripe_stub import CHECKOUT_HOST

pytestmark = pytest.mark.slow


def payment_page(gateway: Gateway,
                 new_context: Callable[..., BrowserContext]) -> tuple[Page, dict[str, Any]]:
    """Alice, logged in, on the page of a 19.99 USD payment asked of her."""
    alice = gateway.create_user("alice")
    link = gateway.ask_for_payment(alice, "Pay for the forecast report", {
        "amount": 1999, "currency": "usd", "description": "Forecast report, one month"})
    page = new_context().new_page()
    page.goto(link["url"])
    log_in(page, alice)
    return page, link


def test_the_pay_button_posts_to_the_gateway_which_sends_the_browser_to_stripe(
    gateway: Gateway, new_context: Callable[..., BrowserContext], watch: Watch,
    screenshot: Screenshot,
) -> None:
    page, link = payment_page(gateway, new_context)
    expect(page).to_have_url(link["url"])

    # What, how much, to whom; nothing to type, no script (SAQ A).
    expect(page.get_by_role("heading", level=1)).to_have_text(
        f"{gateway.client_name} asks for a payment")
    main = page.get_by_role("main")
    expect(main).to_contain_text("19.99 USD")
    expect(main).to_contain_text("Forecast report, one month")
    expect(page.locator("dt:text-is('Paid to') + dd")).to_have_text(gateway.client_name)
    expect(page.locator("input:not([type=hidden])")).to_have_count(0)
    expect(page.locator("script")).to_have_count(0)
    form = page.locator("form", has=page.get_by_role("button", name="Pay 19.99 USD with Stripe"))
    expect(form).to_have_attribute("action", f"/e/{link['id']}/checkout")
    expect(form).to_have_attribute("method", "post")
    screenshot(page, "payment")

    # Stripe's page is answered here: the browser is sent there, nothing leaves the machine.
    watch.expect_origin(CHECKOUT_HOST)
    reached: list[str] = []

    def stripe_checkout(route: Route) -> None:
        reached.append(route.request.url)
        route.fulfill(status=200, content_type="text/html",
                      body="<!doctype html><title>Stripe Checkout</title><p>Checkout</p>")

    page.route(f"{CHECKOUT_HOST}/**", stripe_checkout)
    checkout_url = gateway.url(f"/e/{link['id']}/checkout")
    with page.expect_response(lambda response: response.url == checkout_url) as posted:
        page.get_by_role("button", name="Pay 19.99 USD with Stripe").click()
    response = posted.value
    assert response.request.method == "POST"
    assert response.status == 303
    [session] = [s for s in gateway.stripe.sessions.values()
                 if s["client_reference_id"] == link["id"]]
    assert response.headers["location"] == session["url"]
    assert re.fullmatch(rf"{re.escape(CHECKOUT_HOST)}/c/pay/cs_test_[0-9a-f]+", session["url"])
    # The CSP let the form's redirect through to Stripe's Checkout host, and only there.
    expect(page).to_have_url(session["url"])
    assert reached == [session["url"]]
    body = next(b for b in gateway.stripe.created if b["client_reference_id"] == link["id"])
    assert body["line_items[0][price_data][unit_amount]"] == "1999"
    assert body["line_items[0][price_data][currency]"] == "usd"
    assert gateway.stripe.idempotency_keys[-1] == f"{link['id']}-checkout-1"
    assert gateway.status_of(link["id"]) == "opened"


def test_back_from_stripe_the_page_says_what_was_paid(
    gateway: Gateway, new_context: Callable[..., BrowserContext], watch: Watch,
    screenshot: Screenshot,
) -> None:
    page, link = payment_page(gateway, new_context)

    # Stripe's page, answered here: the user pays, and Stripe sends the
    # browser to the success URL the gateway gave it.
    watch.expect_origin(CHECKOUT_HOST)

    def pay_on_stripe(route: Route) -> None:
        session_id = route.request.url.rsplit("/", 1)[1]
        gateway.stripe.pay(session_id)
        success_url = gateway.stripe.sessions[session_id]["success_url"]
        route.fulfill(status=303, headers={
            "Location": success_url.replace("{CHECKOUT_SESSION_ID}", session_id)})

    page.route(f"{CHECKOUT_HOST}/**", pay_on_stripe)
    page.get_by_role("button", name="Pay 19.99 USD with Stripe").click()
    expect(page).to_have_url(re.compile(r"/return\?session_id=cs_test_"))

    expect(page.get_by_role("heading", level=1)).to_have_text("Payment received")
    expect(page.get_by_role("main")).to_contain_text(
        f"You paid 19.99 USD to {gateway.client_name}.")
    expect(page.get_by_role("main").locator("form")).to_have_count(0)  # nothing left to pay
    screenshot(page, "payment-received")
    assert gateway.status_of(link["id"]) == "completed"
