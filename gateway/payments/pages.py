"""What the portal shows of a payment: the checkout page and the outcome pages.

Rendered for views that have already run the subject check. The pages hold
no card field and load no Stripe script: the user pays on Stripe's own page
(PCI DSS SAQ A). Only a page that carries the checkout form opens the CSP's
``form-action`` to Stripe's Checkout host, because the browser applies
``form-action`` to the redirect that follows the form.
"""

from __future__ import annotations

from typing import Any

from flask import render_template
from sqlalchemy.orm import Session

from gateway.elicitations.lifecycle import OPEN
from gateway.elicitations.models import Elicitation
from gateway.payments import service
from gateway.payments.currencies import format_amount
from gateway.payments.models import Payment
from gateway.payments.service import PaymentStatus
from gateway.payments.stripe_gateway import CHECKOUT_ORIGIN
from gateway.web.context import client_name
from gateway.web.headers import csp_allow_here

HEADINGS = {PaymentStatus.PAID: "Payment received",
            PaymentStatus.PROCESSING: "Payment processing",
            PaymentStatus.FAILED: "Payment failed"}


def what_is_paid(elicitation: Elicitation) -> dict[str, Any]:
    """The amount, description and kind of payment, as the page words them."""
    requested = elicitation.payment or {}
    subscription = requested.get("mode") == "subscription"
    if "amount" in requested:
        return {"amount": format_amount(requested["amount"], requested["currency"]),
                "description": requested["description"], "subscription": subscription}
    quantity = requested.get("quantity", 1)
    return {"amount": None, "subscription": subscription,
            "description": f"{quantity} x Stripe price {requested.get('price_id', '')}"}


def checkout_page(session: Session, context: dict[str, Any]) -> str:
    """The payment request: what, how much, to whom, and the one button to Stripe.

    ``context`` is the elicitation page's (elicitation, client_name, subject, expiry).
    """
    elicitation: Elicitation = context["elicitation"]
    latest = service.latest_payment(session, elicitation.id)
    processing = latest is not None and latest.status == PaymentStatus.PROCESSING
    if not processing:
        csp_allow_here("form-action", CHECKOUT_ORIGIN)
    return render_template("elicitation_payment.html", asked="a payment",
                           paid=what_is_paid(elicitation), processing=processing, **context)


def outcome_page(elicitation: Elicitation, payment: Payment) -> str:
    """Back from Stripe: paid, processing, failed, or not paid with a way to try again."""
    can_retry = payment.status in (PaymentStatus.OPEN, PaymentStatus.EXPIRED) and \
        elicitation.status in OPEN
    if can_retry:
        csp_allow_here("form-action", CHECKOUT_ORIGIN)
    amount = format_amount(payment.amount, payment.currency) \
        if payment.amount is not None and payment.currency else None
    heading = HEADINGS.get(PaymentStatus(payment.status), "Not paid")
    return render_template("payment_outcome.html", status=payment.status, amount=amount,
                           heading=heading,
                           client_name=client_name(elicitation.client_id),
                           elicitation=elicitation, can_retry=can_retry)
