"""The payment routes: the checkout button, the return from Stripe, and Stripe's webhook.

``/e/<id>/checkout`` and ``/e/<id>/return`` sit behind the same subject check
as the elicitation page, run again on every request. ``/stripe/webhook`` is
the one form-less POST outside the API: it proves itself with
``Stripe-Signature`` instead of a CSRF token or an API token.
"""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, redirect, request
from werkzeug.wrappers import Response

from gateway import db
from gateway.elicitations.lifecycle import TERMINAL
from gateway.elicitations.views import Page, ended, open_for
from gateway.errors import GatewayError, NotFound
from gateway.identity.sessions import Subject
from gateway.identity.web import actor_of, signed_in
from gateway.payments import pages, service
from gateway.payments.service import PaymentInProgress, PaymentStatus
from gateway.payments.stripe_gateway import CHECKOUT_ORIGIN, Stripe
from gateway.settings import Settings
from gateway.web.context import current_clock
from gateway.web.headers import csp_allow

blueprint = Blueprint("payments", __name__)

_NOT_OURS = ("This payment link is not valid. Go back to the app and open its link again.")


def _stripe() -> Stripe:
    stripe: Stripe = current_app.extensions["gateway.stripe"]
    return stripe


@blueprint.post("/e/<id:elicitation_id>/checkout")
@csp_allow("form-action", CHECKOUT_ORIGIN)  # an error page here may offer "try again"
@signed_in(back="/e/{elicitation_id}")
def checkout(elicitation_id: str, subject: Subject) -> Page:
    """Start (or resume) Stripe Checkout for the user the payment was asked of: 303 to Stripe."""
    settings: Settings = current_app.extensions["gateway.settings"]
    actor, source_ip = actor_of(subject), request.remote_addr
    with db.transaction() as session:
        elicitation = open_for(session, subject, elicitation_id)
        if elicitation.status in TERMINAL:
            return ended(elicitation)
        if elicitation.kind != "payment":
            raise GatewayError("This request is not a payment. Reload the page.")
        try:
            plan = service.plan_checkout(session, current_clock(), elicitation,
                                         public_url=settings.public_url, actor=actor,
                                         source_ip=source_ip)
        except PaymentInProgress:
            payment = service.latest_payment(session, elicitation.id)
            assert payment is not None
            return pages.outcome_page(elicitation, payment)
    if plan.reuse_url is not None:
        return redirect(plan.reuse_url, code=303)
    assert plan.request is not None
    # Outside any transaction: Stripe may take a moment to answer.
    created = _stripe().create_checkout_session(plan.request)

    def record() -> Page:
        with db.transaction() as session:
            # Checked again: the elicitation may have ended while Stripe answered.
            elicitation = open_for(session, subject, elicitation_id)
            if elicitation.status in TERMINAL:
                return ended(elicitation)
            payment = service.record_checkout(session, current_clock(), elicitation, plan,
                                              created, actor=actor, source_ip=source_ip)
            assert payment.checkout_url is not None
            return redirect(payment.checkout_url, code=303)

    # A double click: the other request stored the same session first; the
    # second attempt finds it.
    return db.retry_on_conflict(record, attempts=2)


@blueprint.get("/e/<id:elicitation_id>/return")
@csp_allow("form-action", CHECKOUT_ORIGIN)  # "not paid" offers "try again"
@signed_in()
def returned(elicitation_id: str, subject: Subject) -> Page:
    """Back from Stripe: ask Stripe how it went, settle it, and say so."""
    session_id = request.args.get("session_id", "")
    with db.transaction() as session:
        elicitation = open_for(session, subject, elicitation_id)
        payment = service.payment_of_session(session, session_id) if session_id else None
        if payment is None or payment.elicitation_id != elicitation.id:
            raise NotFound(_NOT_OURS)
        settled = payment.status not in (PaymentStatus.OPEN, PaymentStatus.PROCESSING)
        if settled:
            # The webhook got here first; Stripe has nothing newer to say.
            return pages.outcome_page(elicitation, payment)
    checkout = _stripe().retrieve_checkout_session(session_id)
    with db.transaction() as session:
        elicitation = open_for(session, subject, elicitation_id)
        payment = service.fulfil(session, current_clock(), checkout, service.status_of(checkout),
                                 actor=actor_of(subject), source_ip=request.remote_addr)
        if payment is None:
            raise NotFound(_NOT_OURS)
        return pages.outcome_page(elicitation, payment)


@blueprint.post("/stripe/webhook")
def stripe_webhook() -> tuple[Response, int]:
    """Stripe's report on a Checkout Session: signature checked, acted on once, acknowledged.

    Exempt from CSRF (see gateway.app): Stripe is a server, not a browser,
    and the signature over the raw body is the proof.
    """
    event = _stripe().verify_event(request.get_data(cache=False),
                                   request.headers.get("Stripe-Signature"))

    def handle() -> str:
        with db.transaction() as session:
            return service.handle_event(session, current_clock(), event,
                                        source_ip=request.remote_addr)

    # The same event delivered twice at once: the other delivery committed
    # it; the second attempt finds its id and does nothing.
    outcome = db.retry_on_conflict(handle, attempts=2)
    return jsonify({"received": True, "outcome": outcome}), 200
