"""From Stripe back to the MCP server: the webhook, the return page, in any order, once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker
from standardwebhooks import Webhook

from gateway import db
from gateway.audit.models import AuditEvent
from gateway.clock import FixedClock
from gateway.outbound import OutboundPolicy
from gateway.payments import service
from gateway.payments.service import PaymentStatus
from gateway.payments.stripe_gateway import CheckoutSession
from gateway.settings import Settings
from gateway.vault.keyring import load_keyring
from gateway.webhooks.dispatcher import Dispatcher
from tests.conftest import Registered
from tests.integration.payments.conftest import (
    STRIPE_WEBHOOK_SECRET,
    FakeStripe,
    Receiver,
    Records,
    StripeWebhook,
    event_body,
    start_checkout,
    stripe_signature,
)
from tests.integration.portal.conftest import Browser

Ask = Callable[..., dict[str, Any]]
LogIn = Callable[[str], Browser]


@pytest.fixture
def checkout(ask_payment: Ask, alice: str, logged_in: LogIn,
             stripe_api: FakeStripe) -> Callable[..., tuple[str, Browser, dict[str, Any]]]:
    """Alice at Stripe's page: her payment elicitation, her browser, and the Checkout Session."""

    def start(**changes: Any) -> tuple[str, Browser, dict[str, Any]]:
        link = ask_payment(alice, **changes)
        user = logged_in(alice)
        assert start_checkout(user, link["id"]).status_code == 303
        return link["id"], user, stripe_api.sessions[stripe_api.by_idempotency_key[
            f"{link['id']}-checkout-1"]]

    return start


def return_from_stripe(user: Browser, elicitation_id: str, session_id: str) -> Any:
    return user.get(f"/e/{elicitation_id}/return?session_id={session_id}")


# --- the card flow, end to end ------------------------------------------------------------


def test_paid_by_card_the_mcp_server_gets_a_signed_completed_with_the_payment(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records, app: Flask, settings: Settings,
    clock: FixedClock, mcp_server: Registered, receiver: Receiver,
) -> None:
    elicitation_id, _, session = checkout()
    paid = stripe_api.pay(session["id"])
    answer = stripe_webhook.send("checkout.session.completed", paid)
    assert answer.status_code == 200
    assert answer.get_json()["outcome"] == "applied"

    assert records.elicitation(elicitation_id).status == "completed"
    [payment] = records.payments(elicitation_id)
    assert (payment.status, payment.payment_intent_id) == ("paid", paid["payment_intent"])

    # The dispatcher sends the outbox row to the MCP server, signed (Standard Webhooks).
    engine = db.make_engine(settings.database_url)
    try:
        dispatcher = Dispatcher(engine, clock, load_keyring(settings),
                                OutboundPolicy.from_settings(settings))
        assert dispatcher.run_once() == 1
    finally:
        engine.dispose()
    [(headers, body)] = receiver.deliveries
    verified = Webhook(mcp_server.webhook_secret).verify(body, headers)
    assert verified["type"] == "elicitation.completed"
    assert verified["data"]["elicitation_id"] == elicitation_id
    assert verified["data"]["payment"] == {
        "status": "paid", "amount": 1999, "currency": "usd", "mode": "payment",
        "checkout_session_id": session["id"], "payment_intent_id": paid["payment_intent"],
        "subscription_id": None}


def test_a_subscription_reports_its_subscription_id(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records,
) -> None:
    elicitation_id, _, session = checkout(payment={"price_id": "price_1Weather",
                                                   "mode": "subscription"})
    paid = stripe_api.pay(session["id"])
    assert stripe_webhook.send("checkout.session.completed", paid).status_code == 200
    [event] = records.events(elicitation_id)
    assert event["data"]["payment"]["subscription_id"] == paid["subscription"]
    assert event["data"]["payment"]["payment_intent_id"] is None
    assert event["data"]["payment"]["mode"] == "subscription"


# --- delayed methods ------------------------------------------------------------------------


def test_a_delayed_payment_that_succeeds(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records, clock: FixedClock,
) -> None:
    elicitation_id, user, session = checkout(ttl_seconds=3600)
    pending = stripe_api.pay(session["id"], delayed=True)
    assert stripe_webhook.send("checkout.session.completed", pending).status_code == 200
    assert records.payments(elicitation_id)[0].status == "processing"
    assert records.elicitation(elicitation_id).status == "opened"
    assert records.events(elicitation_id) == []
    page = return_from_stripe(user, elicitation_id, session["id"])
    assert "Payment processing" in page.get_data(as_text=True)
    # Days pass while the bank works; the request does not expire underneath it.
    clock.advance(days=3)
    cleared = stripe_api.clear(session["id"])
    assert stripe_webhook.send("checkout.session.async_payment_succeeded",
                               cleared).status_code == 200
    assert records.elicitation(elicitation_id).status == "completed"
    [event] = records.events(elicitation_id)
    assert event["type"] == "elicitation.completed"
    assert event["data"]["payment"]["status"] == "paid"


def test_a_delayed_payment_that_fails(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records,
) -> None:
    elicitation_id, user, session = checkout()
    pending = stripe_api.pay(session["id"], delayed=True)
    stripe_webhook.send("checkout.session.completed", pending)
    assert stripe_webhook.send("checkout.session.async_payment_failed",
                               pending).status_code == 200
    assert records.elicitation(elicitation_id).status == "failed"
    assert records.payments(elicitation_id)[0].status == "failed"
    [event] = records.events(elicitation_id)
    assert event["type"] == "elicitation.failed"
    assert event["data"]["payment"]["status"] == "failed"
    page = return_from_stripe(user, elicitation_id, session["id"])
    assert "Payment failed" in page.get_data(as_text=True)


# --- expiry ---------------------------------------------------------------------------------


def test_an_expired_session_with_time_left_lets_the_user_try_again(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records,
) -> None:
    elicitation_id, user, session = checkout(ttl_seconds=6 * 3600)
    assert stripe_webhook.send("checkout.session.expired",
                               stripe_api.expire(session["id"])).status_code == 200
    assert records.payments(elicitation_id)[0].status == "expired"
    assert records.elicitation(elicitation_id).status == "opened"
    page = return_from_stripe(user, elicitation_id, session["id"])
    html = page.get_data(as_text=True)
    assert "Not paid" in html
    assert "Try again" in html
    again = start_checkout(user, elicitation_id)
    assert again.status_code == 303
    assert stripe_api.create_headers[-1]["Idempotency-Key"] == f"{elicitation_id}-checkout-2"
    assert [p.attempt for p in records.payments(elicitation_id)] == [1, 2]
    assert again.headers["Location"] != session["url"]


def test_an_expired_session_at_the_end_of_the_request_expires_it(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records, clock: FixedClock,
) -> None:
    elicitation_id, _, session = checkout(ttl_seconds=3600)
    clock.advance(seconds=3601)
    assert stripe_webhook.send("checkout.session.expired",
                               stripe_api.expire(session["id"])).status_code == 200
    assert records.elicitation(elicitation_id).status == "expired"
    [event] = records.events(elicitation_id)
    assert event["type"] == "elicitation.expired"
    assert event["data"]["payment"]["status"] == "expired"


# --- the two messengers, in either order ---------------------------------------------------


def test_webhook_before_return(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records,
) -> None:
    elicitation_id, user, session = checkout()
    stripe_webhook.send("checkout.session.completed", stripe_api.pay(session["id"]))
    page = return_from_stripe(user, elicitation_id, session["id"])
    assert page.status_code == 200
    assert "Payment received" in page.get_data(as_text=True)
    assert "19.99 USD" in page.get_data(as_text=True)
    assert stripe_api.retrieved == []  # settled already: Stripe is not asked again
    assert len(records.events(elicitation_id)) == 1


def test_return_before_webhook(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records,
) -> None:
    elicitation_id, user, session = checkout()
    paid = stripe_api.pay(session["id"])
    page = return_from_stripe(user, elicitation_id, session["id"])
    assert "Payment received" in page.get_data(as_text=True)
    assert stripe_api.retrieved == [session["id"]]
    assert records.elicitation(elicitation_id).status == "completed"
    late = stripe_webhook.send("checkout.session.completed", paid)
    assert late.status_code == 200
    assert late.get_json()["outcome"] == "unchanged"
    [event] = records.events(elicitation_id)
    assert event["data"]["payment"]["payment_intent_id"] == paid["payment_intent"]


def test_returning_unpaid_offers_to_try_again(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], records: Records,
) -> None:
    elicitation_id, user, session = checkout()
    page = return_from_stripe(user, elicitation_id, session["id"])
    html = page.get_data(as_text=True)
    assert "Not paid" in html
    assert "Try again" in html
    assert "checkout.stripe.com" in page.headers["Content-Security-Policy"]
    assert records.elicitation(elicitation_id).status == "opened"


def test_bob_returning_from_alices_checkout_is_refused(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    bob: str, logged_in: LogIn, records: Records,
) -> None:
    elicitation_id, _, session = checkout()
    stripe_api.pay(session["id"])
    refused = return_from_stripe(logged_in(bob), elicitation_id, session["id"])
    assert refused.status_code == 403
    assert stripe_api.retrieved == []
    assert records.elicitation(elicitation_id).status == "opened"
    assert records.payments(elicitation_id)[0].status == "open"


def test_a_session_of_another_request_is_not_accepted(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], ask_payment: Ask,
    alice: str, stripe_api: FakeStripe,
) -> None:
    _, user, session = checkout()
    other = ask_payment(alice)
    for session_id in (session["id"], "cs_test_unknown", ""):
        answer = return_from_stripe(user, other["id"], session_id)
        assert answer.status_code == 404
    assert stripe_api.retrieved == []


def test_webhook_and_return_racing_complete_once(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    records: Records, app: Flask, clock: FixedClock,
) -> None:
    elicitation_id, _, session = checkout()
    paid = CheckoutSession.from_stripe(stripe_api.pay(session["id"]))
    sessions = sessionmaker(db.engine_of(app), expire_on_commit=False)
    start = threading.Barrier(2)
    results: list[str] = []

    def messenger(actor: str) -> None:
        with sessions() as session, session.begin():
            start.wait()
            payment = service.fulfil(session, clock, paid, PaymentStatus.PAID, actor=actor)
            assert payment is not None
            results.append(payment.status)

    threads = [threading.Thread(target=messenger, args=(name,))
               for name in ("stripe:webhook", "user:alice")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == ["paid", "paid"]
    assert records.elicitation(elicitation_id).status == "completed"
    assert len(records.events(elicitation_id)) == 1


# --- Stripe's events: duplicates, order, signatures --------------------------------------


def test_a_duplicate_event_is_processed_once(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records,
) -> None:
    elicitation_id, _, session = checkout()
    paid = stripe_api.pay(session["id"])
    first = stripe_webhook.send("checkout.session.completed", paid, event_id="evt_once")
    again = stripe_webhook.send("checkout.session.completed", paid, event_id="evt_once")
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.get_json()["outcome"] == "duplicate"
    assert len(records.events(elicitation_id)) == 1
    assert [e.id for e in records.stripe_events()] == ["evt_once"]


def test_events_out_of_order_end_in_the_latest_state(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records,
) -> None:
    elicitation_id, _, session = checkout()
    pending = dict(stripe_api.pay(session["id"], delayed=True))
    cleared = stripe_api.clear(session["id"])
    # "succeeded" overtakes "completed (awaiting payment)"; a stale "expired" trails.
    assert stripe_webhook.send("checkout.session.async_payment_succeeded",
                               cleared).get_json()["outcome"] == "applied"
    assert stripe_webhook.send("checkout.session.completed",
                               pending).get_json()["outcome"] == "unchanged"
    assert stripe_webhook.send("checkout.session.expired",
                               {**pending, "status": "expired"}).get_json()["outcome"] == \
        "unchanged"
    assert records.payments(elicitation_id)[0].status == "paid"
    assert records.elicitation(elicitation_id).status == "completed"
    assert [e["type"] for e in records.events(elicitation_id)] == ["elicitation.completed"]


@pytest.mark.parametrize("forgery", ["wrong-secret", "missing", "too-old", "tampered",
                                     "garbage"])
def test_a_bad_signature_is_refused_and_changes_nothing(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records, forgery: str,
) -> None:
    elicitation_id, _, session = checkout()
    paid = stripe_api.pay(session["id"])
    if forgery == "wrong-secret":
        answer = stripe_webhook.send("checkout.session.completed", paid,
                                     secret="whsec_someone_else")
    elif forgery == "missing":
        answer = stripe_webhook.post(json.dumps({"id": "evt_1", "type":
                                                 "checkout.session.completed"}).encode(), None)
    elif forgery == "too-old":
        answer = stripe_webhook.send("checkout.session.completed", paid, age=301)
    elif forgery == "tampered":
        # A genuine signature, over another body.
        honest = event_body("checkout.session.expired", {**paid, "status": "expired"})
        signature = stripe_signature(honest, STRIPE_WEBHOOK_SECRET, int(time.time()))
        answer = stripe_webhook.post(event_body("checkout.session.completed", paid), signature)
    else:
        answer = stripe_webhook.send("checkout.session.completed", paid, signature="v1=zz")
    assert answer.status_code == 400
    assert records.elicitation(elicitation_id).status == "opened"
    assert records.payments(elicitation_id)[0].status == "open"
    assert records.stripe_events() == []
    assert records.events(elicitation_id) == []


def test_an_unknown_event_type_is_acknowledged_and_ignored(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records,
) -> None:
    elicitation_id, _, _ = checkout()
    answer = stripe_webhook.send("customer.created", {"id": "cus_1", "object": "customer"})
    assert answer.status_code == 200
    assert answer.get_json()["outcome"] == "ignored"
    assert records.elicitation(elicitation_id).status == "opened"
    assert records.events(elicitation_id) == []


def test_a_session_the_gateway_did_not_start_is_ignored(
    stripe_webhook: StripeWebhook, stripe_api: FakeStripe,
) -> None:
    foreign = {"id": "cs_test_foreign", "object": "checkout.session", "status": "complete",
               "payment_status": "paid", "client_reference_id": "el_somebody_else"}
    answer = stripe_webhook.send("checkout.session.completed", foreign)
    assert answer.status_code == 200
    assert answer.get_json()["outcome"] == "ignored"


def test_the_webhook_needs_no_csrf_token_nor_api_token(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook,
) -> None:
    # The Flask test client sends no cookie, no token: only Stripe's signature.
    _, _, session = checkout()
    answer = stripe_webhook.send("checkout.session.completed", stripe_api.pay(session["id"]))
    assert answer.status_code == 200


def test_a_payment_after_the_request_was_cancelled_is_recorded_for_a_refund(
    checkout: Callable[..., tuple[str, Browser, dict[str, Any]]], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, records: Records, mcp_api: Any, app: Flask,
) -> None:
    elicitation_id, _, session = checkout()
    assert mcp_api.post(f"/api/v1/elicitations/{elicitation_id}/cancel").status_code == 200
    stripe_webhook.send("checkout.session.completed", stripe_api.pay(session["id"]))
    assert records.elicitation(elicitation_id).status == "cancelled"
    assert records.payments(elicitation_id)[0].status == "paid"
    assert [e["type"] for e in records.events(elicitation_id)] == ["elicitation.cancelled"]
    with app.app_context():
        flagged = db.session().scalars(select(AuditEvent).where(
            AuditEvent.action == "payment.settled_after_end")).all()
    assert [event.outcome for event in flagged] == ["failure"]
