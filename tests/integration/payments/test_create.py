"""Creating payment elicitations: what is accepted, and every bad input refused up front."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask

from gateway.elicitations.models import Elicitation
from tests.conftest import Api
from tests.integration.api.test_create import SUBJECT, assert_problem, count
from tests.integration.payments.conftest import FakeStripe, amount_payment


def payment_body(payment: Any) -> dict[str, Any]:
    return {"subject": SUBJECT, "kind": "payment", "message": "Pay for the report",
            "payment": payment}


@pytest.mark.parametrize("payment", [
    amount_payment(),
    amount_payment(currency="jpy", amount=500),
    {"price_id": "price_1Weather"},
    {"price_id": "price_1Weather", "quantity": 2, "mode": "subscription",
     "customer_email": "alice@example.com"},
], ids=["amount", "zero-decimal", "price", "subscription"])
def test_a_payment_is_accepted_and_asks_stripe_nothing_yet(
    mcp_api: Api, payment: dict[str, Any], stripe_api: FakeStripe,
) -> None:
    response = mcp_api.post("/api/v1/elicitations", payment_body(payment))
    assert response.status_code == 201, response.get_data(as_text=True)
    created = response.get_json()
    assert created["kind"] == "payment"
    assert created["payment"]["mode"] == payment.get("mode", "payment")
    assert stripe_api.created == []


@pytest.mark.parametrize(("payment", "words"), [
    (amount_payment(amount=0), ["payment.amount", "greater than or equal to 1"]),
    (amount_payment(amount=-5), ["payment.amount"]),
    (amount_payment(currency="xyz"), ["payment.currency", "'xyz' is not a currency"]),
    (amount_payment(currency="USD"), ["payment.currency"]),
    ({**amount_payment(), "price_id": "price_1Weather"}, ["either amount", "not both"]),
    ({"quantity": 1}, ["either amount", "not both"]),
    ({}, ["either amount"]),
    (amount_payment(mode="subscription"), ["payment.mode"]),
    ({"price_id": "prod_123"}, ["payment.price_id"]),
    (amount_payment(description=""), ["payment.description"]),
], ids=["zero", "negative", "unknown-currency", "upper-case-currency", "amount-and-price",
        "neither", "empty", "one-off-amount-as-subscription", "not-a-price", "no-description"])
def test_bad_payments_are_refused_with_the_field_named(
    mcp_api: Api, app: Flask, payment: dict[str, Any], words: list[str],
) -> None:
    assert_problem(mcp_api.post("/api/v1/elicitations", payment_body(payment)), 422, *words)
    assert count(app, Elicitation) == 0
