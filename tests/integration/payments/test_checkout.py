"""The payment page and its one button: what Stripe is asked for, and who may ask."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from sqlalchemy import delete

from gateway import db
from gateway.clock import FixedClock
from gateway.payments.models import Payment
from gateway.payments.stripe_gateway import CHECKOUT_ORIGIN
from tests.conftest import Registered
from tests.integration.payments.conftest import (
    CHECKOUT_HOST,
    STRIPE_KEY,
    FakeStripe,
    Records,
    start_checkout,
)
from tests.integration.portal.conftest import Browser, csrf_of

Ask = Callable[..., dict[str, Any]]
LogIn = Callable[[str], Browser]


def form_action(response: Any) -> str:
    policy = response.headers["Content-Security-Policy"]
    found = re.search(r"form-action ([^;]*)", policy)
    assert found
    return found.group(1)


def test_the_page_shows_what_how_much_and_to_whom_with_one_button(
    ask_payment: Ask, alice: str, logged_in: LogIn, mcp_server: Registered,
    stripe_api: FakeStripe,
) -> None:
    link = ask_payment(alice)
    page = logged_in(alice).get(f"/e/{link['id']}")
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert "19.99 USD" in html
    assert "Forecast report, one month" in html
    assert f"Paid to</dt><dd>{mcp_server.name}" in html
    assert html.count(f'action="/e/{link["id"]}/checkout"') == 1
    assert "Pay 19.99 USD with Stripe" in html
    # SAQ A: no card field, no Stripe script; the user types nothing here.
    inputs = re.findall(r"<input[^>]*>", html)
    assert inputs
    assert all('type="hidden"' in tag for tag in inputs), inputs
    assert "js.stripe.com" not in html
    assert "<script" not in html
    # Only this page may post (and be redirected) to Stripe's Checkout.
    assert form_action(page) == f"'self' {CHECKOUT_ORIGIN}"
    assert stripe_api.created == []  # opening the page asks Stripe nothing


def test_only_payment_pages_open_the_policy_to_stripe(
    link_for: Callable[..., dict[str, Any]], alice: str, logged_in: LogIn,
) -> None:
    key_request = link_for(alice)
    page = logged_in(alice).get(f"/e/{key_request['id']}")
    assert form_action(page) == "'self'"
    assert form_action(logged_in(alice).get("/login")) == "'self'"


def test_checkout_creates_one_session_with_what_was_asked(
    ask_payment: Ask, alice: str, logged_in: LogIn, mcp_server: Registered,
    stripe_api: FakeStripe, records: Records, clock: FixedClock,
) -> None:
    link = ask_payment(alice, ttl_seconds=3600, payment={
        "amount": 1999, "currency": "usd", "description": "Forecast report, one month",
        "customer_email": "alice@example.com"})
    answer = start_checkout(logged_in(alice), link["id"])

    session = stripe_api.only_session()
    assert answer.status_code == 303
    assert answer.headers["Location"] == f"{CHECKOUT_HOST}/c/pay/{session['id']}"
    [body] = stripe_api.created
    assert body["mode"] == "payment"
    assert body["line_items[0][price_data][unit_amount]"] == "1999"
    assert body["line_items[0][price_data][currency]"] == "usd"
    assert body["line_items[0][price_data][product_data][name]"] == "Forecast report, one month"
    assert body["line_items[0][quantity]"] == "1"
    assert body["client_reference_id"] == link["id"]
    assert body["metadata[elicitation_id]"] == link["id"]
    assert body["metadata[client_id]"] == mcp_server.id
    assert body["payment_intent_data[metadata][elicitation_id]"] == link["id"]
    assert body["customer_email"] == "alice@example.com"
    assert body["success_url"] == (
        f"https://gateway.test/e/{link['id']}/return?session_id={{CHECKOUT_SESSION_ID}}")
    assert body["cancel_url"] == f"https://gateway.test/e/{link['id']}"
    # Within Stripe's window, and no later than the elicitation needs.
    expires_at = int(body["expires_at"])
    assert expires_at == int(records.elicitation(link["id"]).expires_at.timestamp())
    assert clock.now().timestamp() + 30 * 60 < expires_at <= clock.now().timestamp() + 24 * 3600
    [headers] = stripe_api.create_headers
    assert headers["Idempotency-Key"] == f"{link['id']}-checkout-1"
    assert headers["Authorization"] == f"Bearer {STRIPE_KEY}"
    [payment] = records.payments(link["id"])
    assert (payment.status, payment.amount, payment.currency) == ("open", 1999, "usd")
    assert payment.checkout_session_id == session["id"]


def test_a_price_or_a_subscription_is_sent_as_a_price(
    ask_payment: Ask, alice: str, logged_in: LogIn, stripe_api: FakeStripe,
) -> None:
    link = ask_payment(alice, payment={"price_id": "price_1Weather", "quantity": 3,
                                       "mode": "subscription"})
    user = logged_in(alice)
    html = user.get(f"/e/{link['id']}").get_data(as_text=True)
    assert "3 x Stripe price price_1Weather" in html
    assert "as a subscription" in html
    assert start_checkout(user, link["id"]).status_code == 303
    [body] = stripe_api.created
    assert body["mode"] == "subscription"
    assert body["line_items[0][price]"] == "price_1Weather"
    assert body["line_items[0][quantity]"] == "3"
    assert body["subscription_data[metadata][elicitation_id]"] == link["id"]
    assert not any(key.startswith("line_items[0][price_data]") for key in body)


def test_a_double_click_makes_one_session(
    ask_payment: Ask, alice: str, logged_in: LogIn, stripe_api: FakeStripe, records: Records,
) -> None:
    link = ask_payment(alice)
    user = logged_in(alice)
    token = csrf_of(user.get(f"/e/{link['id']}"))
    first = user.client.post(f"/e/{link['id']}/checkout", data={"csrf_token": token})
    second = user.client.post(f"/e/{link['id']}/checkout", data={"csrf_token": token})
    assert first.status_code == second.status_code == 303
    assert first.headers["Location"] == second.headers["Location"]
    assert len(stripe_api.sessions) == 1
    assert len(records.payments(link["id"])) == 1


def test_two_clicks_racing_to_stripe_share_one_session(
    ask_payment: Ask, alice: str, logged_in: LogIn, stripe_api: FakeStripe, records: Records,
) -> None:
    # Both clicks reach Stripe before either is stored: the Idempotency-Key,
    # derived from the elicitation, makes Stripe answer both with one session.
    link = ask_payment(alice)
    user = logged_in(alice)
    token = csrf_of(user.get(f"/e/{link['id']}"))
    first = user.client.post(f"/e/{link['id']}/checkout", data={"csrf_token": token})
    with records.app.app_context(), db.transaction() as session:
        # As if the first click had not stored its session yet.
        session.execute(delete(Payment))
    second = user.client.post(f"/e/{link['id']}/checkout", data={"csrf_token": token})
    assert first.headers["Location"] == second.headers["Location"]
    keys = {headers["Idempotency-Key"] for headers in stripe_api.create_headers}
    assert keys == {f"{link['id']}-checkout-1"}
    assert len(stripe_api.sessions) == 1
    assert len(records.payments(link["id"])) == 1


def test_a_short_lived_request_is_held_open_as_long_as_stripe_keeps_the_session(
    ask_payment: Ask, alice: str, logged_in: LogIn, stripe_api: FakeStripe, records: Records,
    clock: FixedClock,
) -> None:
    link = ask_payment(alice, ttl_seconds=120)
    start_checkout(logged_in(alice), link["id"])
    [body] = stripe_api.created
    expires_at = int(body["expires_at"])
    assert expires_at >= clock.now().timestamp() + 30 * 60  # Stripe's minimum
    assert int(records.elicitation(link["id"]).expires_at.timestamp()) == expires_at
    clock.advance(minutes=10)
    assert records.elicitation(link["id"]).status == "opened"


def test_checkout_needs_the_csrf_token(
    ask_payment: Ask, alice: str, logged_in: LogIn, stripe_api: FakeStripe, records: Records,
) -> None:
    link = ask_payment(alice)
    user = logged_in(alice)
    user.get(f"/e/{link['id']}")
    refused = user.client.post(f"/e/{link['id']}/checkout", data={})
    assert refused.status_code == 400
    assert stripe_api.created == []
    assert records.payments(link["id"]) == []


def test_bob_cannot_start_alices_checkout(
    ask_payment: Ask, alice: str, bob: str, logged_in: LogIn, stripe_api: FakeStripe,
    records: Records,
) -> None:
    link = ask_payment(alice)
    bobs = logged_in(bob)
    # Bob's token from his own refusal page: a valid token for his session.
    refused = bobs.post_form(f"/e/{link['id']}/checkout", {}, page=f"/e/{link['id']}")
    assert refused.status_code == 403
    assert "another account" in refused.get_data(as_text=True)
    assert stripe_api.created == []
    assert records.elicitation(link["id"]).status == "pending"


def test_without_login_checkout_sends_to_the_login_page(
    ask_payment: Ask, browser: Callable[[], Browser], stripe_api: FakeStripe,
) -> None:
    link = ask_payment("alice")
    answer = browser().client.post(f"/e/{link['id']}/checkout")
    # No session, so no CSRF token either: refused before anything else.
    assert answer.status_code in (302, 400)
    assert stripe_api.created == []


def test_when_stripe_fails_nothing_is_stored_and_the_user_may_retry(
    ask_payment: Ask, alice: str, logged_in: LogIn, stripe_api: FakeStripe, records: Records,
) -> None:
    link = ask_payment(alice)
    user = logged_in(alice)
    stripe_api.fail_with = 500
    failed = start_checkout(user, link["id"])
    assert failed.status_code == 502
    assert "Nothing was charged" in failed.get_data(as_text=True)
    assert records.payments(link["id"]) == []
    stripe_api.fail_with = None
    assert start_checkout(user, link["id"]).status_code == 303
    assert len(records.payments(link["id"])) == 1


def test_an_ended_request_starts_no_checkout(
    ask_payment: Ask, mcp_api: Any, alice: str, logged_in: LogIn, stripe_api: FakeStripe,
) -> None:
    link = ask_payment(alice)
    user = logged_in(alice)
    token = csrf_of(user.get(f"/e/{link['id']}"))
    mcp_api.post(f"/api/v1/elicitations/{link['id']}/cancel")
    answer = user.client.post(f"/e/{link['id']}/checkout", data={"csrf_token": token})
    assert answer.status_code == 200
    assert "withdrawn" in answer.get_data(as_text=True)
    assert stripe_api.created == []


def test_login_then_back_to_the_return_page_keeps_the_session_id(
    ask_payment: Ask, browser: Callable[[], Browser],
) -> None:
    link = ask_payment("alice")
    answer = browser().get(f"/e/{link['id']}/return?session_id=cs_test_1")
    assert answer.status_code == 302
    assert quote(f"/e/{link['id']}/return?session_id=cs_test_1", safe="") in \
        answer.headers["Location"]


def test_the_payment_page_after_expiry_says_so(
    ask_payment: Ask, alice: str, logged_in: LogIn, clock: FixedClock,
) -> None:
    link = ask_payment(alice, ttl_seconds=60)
    clock.advance(seconds=61)
    page = logged_in(alice).get(f"/e/{link['id']}")
    assert "expired" in page.get_data(as_text=True)
    assert timedelta(seconds=61)  # the clock moved; nothing else to pay
