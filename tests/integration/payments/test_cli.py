"""The operator's view of payments: ``gateway elicitations show`` and ``gateway payments list``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import Result
from tests.integration.payments.conftest import FakeStripe, StripeWebhook, start_checkout
from tests.integration.portal.conftest import Browser

pytestmark = pytest.mark.slow


def test_payments_show_on_the_elicitation_and_list_by_status(
    ask_payment: Callable[..., dict[str, Any]], alice: str,
    logged_in: Callable[[str], Browser], stripe_api: FakeStripe,
    stripe_webhook: StripeWebhook, invoke_gateway: Callable[..., Result],
) -> None:
    paid_link, open_link = ask_payment(alice), ask_payment(alice)
    user = logged_in(alice)
    start_checkout(user, paid_link["id"])
    start_checkout(user, open_link["id"])
    paid_session = stripe_api.by_idempotency_key[f"{paid_link['id']}-checkout-1"]
    paid = stripe_api.pay(paid_session)
    assert stripe_webhook.send("checkout.session.completed", paid).status_code == 200

    shown = invoke_gateway("elicitations", "show", paid_link["id"], "--json")
    assert shown.code == 0, shown.stderr
    [payment] = json.loads(shown.stdout)["payments"]
    assert payment["status"] == "paid"
    assert (payment["amount"], payment["currency"]) == (1999, "usd")
    assert payment["checkout_session_id"] == paid_session
    assert payment["payment_intent_id"] == paid["payment_intent"]

    table = invoke_gateway("elicitations", "show", paid_link["id"])
    assert f"paid  1999 usd  {paid_session}  {paid['payment_intent']}" in table.stdout

    listed = invoke_gateway("payments", "list", "--status", "paid", "--json")
    assert [p["elicitation_id"] for p in json.loads(listed.stdout)["items"]] == [paid_link["id"]]
    still_open = invoke_gateway("payments", "list", "--status", "open")
    assert open_link["id"] in still_open.stdout
    assert paid_link["id"] not in still_open.stdout
