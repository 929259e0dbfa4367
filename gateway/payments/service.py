"""Starting Stripe Checkout for a payment elicitation, and settling what Stripe reports.

Two messengers tell the gateway how a payment went: Stripe's webhook, and
the user's browser coming back to the return page (which asks Stripe). They
may arrive in either order, twice, or at the same moment. Both call
:func:`fulfil`, which moves a payment forward only along
:data:`STATUS_TRANSITIONS` with a conditional UPDATE: whoever comes first
settles the payment and ends the elicitation, in one transaction with the
audit row and the webhook to the MCP server; the other finds the payment
settled and changes nothing.

The caller runs each function inside one transaction; nothing here talks to
Stripe, so no transaction waits on the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.clock import Clock
from gateway.elicitations import lifecycle
from gateway.elicitations.lifecycle import OPEN, Status
from gateway.elicitations.models import Elicitation
from gateway.errors import Conflict
from gateway.payments.models import Payment, StripeEvent
from gateway.payments.stripe_gateway import CheckoutRequest, CheckoutSession, StripeUnavailable
from gateway.tokens import new_id

STRIPE_ACTOR: Final = "stripe:webhook"


class PaymentStatus(StrEnum):
    OPEN = "open"  # the Checkout Session can still be paid
    PROCESSING = "processing"  # paid with a delayed method; the money is on its way
    PAID = "paid"
    FAILED = "failed"  # a delayed payment did not go through
    EXPIRED = "expired"  # the Checkout Session expired unpaid


STATUS_TRANSITIONS: Final[dict[PaymentStatus, frozenset[PaymentStatus]]] = {
    PaymentStatus.OPEN: frozenset({PaymentStatus.PROCESSING, PaymentStatus.PAID,
                                   PaymentStatus.FAILED, PaymentStatus.EXPIRED}),
    # Stripe may deliver "succeeded" before "completed (unpaid)": the later,
    # older news then finds the payment settled and is ignored.
    PaymentStatus.PROCESSING: frozenset({PaymentStatus.PAID, PaymentStatus.FAILED}),
}

# Stripe's window for a Checkout Session's expires_at is 30 minutes to 24
# hours after creation; a minute's margin each side absorbs clock skew and
# the time the request takes.
SESSION_MIN: Final = timedelta(minutes=31)
SESSION_MAX: Final = timedelta(hours=23, minutes=59)
# A delayed method (SEPA Direct Debit, ACH) settles within days, up to two
# weeks. While it does, its elicitation must not expire underneath it.
PROCESSING_HOLD: Final = timedelta(days=14)
# An open session this close to its end is not offered again; a new one is.
REUSE_MARGIN: Final = timedelta(minutes=2)

# Stripe's events the gateway acts on; any other type is acknowledged and ignored.
HANDLED_EVENTS: Final = frozenset({
    "checkout.session.completed",
    "checkout.session.async_payment_succeeded",
    "checkout.session.async_payment_failed",
    "checkout.session.expired",
})


class PaymentInProgress(Conflict):
    code = "payment-in-progress"
    title = "A payment is already on its way"


# --- starting Checkout ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """What the checkout button leads to: an open session again, or a new one to create."""

    reuse_url: str | None
    request: CheckoutRequest | None
    attempt: int


def plan_checkout(session: Session, clock: Clock, elicitation: Elicitation, *,
                  public_url: str, actor: str, source_ip: str | None) -> Plan:
    """Decide what the checkout button does, holding the elicitation open long enough.

    The Idempotency-Key is the elicitation's id and the attempt number: a
    double click (or a retry by the library) asks for the same attempt and
    gets the same Checkout Session back from Stripe.
    """
    now = clock.now()
    latest = latest_payment(session, elicitation.id)
    if latest is not None:
        if latest.status == PaymentStatus.PROCESSING:
            raise PaymentInProgress("Your payment is being processed. There is nothing more "
                                    "to pay; the app will hear when it has gone through.")
        if latest.status == PaymentStatus.OPEN and latest.checkout_url and \
                latest.session_expires_at - REUSE_MARGIN > now:
            return Plan(latest.checkout_url, None, latest.attempt)
    attempt = latest.attempt + 1 if latest is not None else 1
    expires_at = min(max(elicitation.expires_at, now + SESSION_MIN), now + SESSION_MAX) \
        .replace(microsecond=0)  # Stripe counts in whole seconds
    if expires_at > elicitation.expires_at:
        # Stripe keeps a session open for 30 minutes at least; the elicitation
        # must outlive it, or a user could pay for a request that had expired.
        hold_open(session, clock, elicitation, expires_at, actor=actor, source_ip=source_ip,
                  reason="checkout")
    request = CheckoutRequest(
        idempotency_key=f"{elicitation.id}-checkout-{attempt}",
        mode=_requested(elicitation).get("mode", "payment"),
        line_item=_line_item(_requested(elicitation)),
        client_reference_id=elicitation.id,
        metadata={"elicitation_id": elicitation.id, "client_id": elicitation.client_id},
        # Stripe fills in {CHECKOUT_SESSION_ID} itself.
        success_url=f"{public_url}/e/{elicitation.id}/return?session_id={{CHECKOUT_SESSION_ID}}",
        cancel_url=f"{public_url}/e/{elicitation.id}",
        expires_at=int(expires_at.timestamp()),
        customer_email=_requested(elicitation).get("customer_email"),
    )
    return Plan(None, request, attempt)


def _requested(elicitation: Elicitation) -> dict[str, Any]:
    return elicitation.payment or {}


def _line_item(requested: dict[str, Any]) -> dict[str, Any]:
    if "price_id" in requested:
        return {"price": requested["price_id"], "quantity": requested.get("quantity", 1)}
    return {"price_data": {"currency": requested["currency"],
                           "unit_amount": requested["amount"],
                           "product_data": {"name": requested["description"]}},
            "quantity": 1}


def record_checkout(session: Session, clock: Clock, elicitation: Elicitation, plan: Plan,
                    created: CheckoutSession, *, actor: str,
                    source_ip: str | None) -> Payment:
    """Keep the session Stripe created; a second click's copy of the same session is kept once."""
    existing = payment_of_session(session, created.id)
    if existing is not None:
        return existing
    if not created.url or not created.url.startswith("https://"):
        raise StripeUnavailable("Stripe did not return a payment page. Nothing was charged. "
                                "Try again in a minute.")
    assert plan.request is not None
    now = clock.now()
    requested = _requested(elicitation)
    payment = Payment(
        id=new_id("pay_", 15), elicitation_id=elicitation.id, client_id=elicitation.client_id,
        attempt=plan.attempt, checkout_session_id=created.id, checkout_url=created.url,
        mode=plan.request.mode, status=PaymentStatus.OPEN.value,
        amount=created.amount_total if created.amount_total is not None
        else requested.get("amount"),
        currency=created.currency or requested.get("currency"),
        created_at=now, updated_at=now,
        session_expires_at=_from_unix(created.expires_at or plan.request.expires_at))
    session.add(payment)
    audit.record(session, clock, actor=actor, action="payment.checkout_started",
                 target=payment.id, source_ip=source_ip,
                 details={"client_id": elicitation.client_id, "elicitation_id": elicitation.id,
                          "checkout_session_id": created.id, "attempt": plan.attempt})
    return payment


def hold_open(session: Session, clock: Clock, elicitation: Elicitation, until: datetime, *,
              actor: str, source_ip: str | None, reason: str) -> None:
    """Push the elicitation's expiry out to ``until`` (never earlier), with an audit row."""
    if until <= elicitation.expires_at:
        return
    previous = elicitation.expires_at
    elicitation.expires_at = until
    audit.record(session, clock, actor=actor, action="elicitation.extended",
                 target=elicitation.id, source_ip=source_ip,
                 details={"client_id": elicitation.client_id, "reason": reason,
                          "from": previous.isoformat(), "to": until.isoformat()})


def _from_unix(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


# --- what Stripe reports ------------------------------------------------------------


def status_of(checkout: CheckoutSession) -> PaymentStatus:
    """What a Checkout Session says by itself (a failed delayed payment needs its event)."""
    if checkout.status == "complete":
        if checkout.payment_status in ("paid", "no_payment_required"):
            return PaymentStatus.PAID
        return PaymentStatus.PROCESSING
    if checkout.status == "expired":
        return PaymentStatus.EXPIRED
    return PaymentStatus.OPEN


def fulfil(session: Session, clock: Clock, checkout: CheckoutSession, status: PaymentStatus,
           *, actor: str, source_ip: str | None = None) -> Payment | None:
    """Apply what Stripe reports about one Checkout Session; idempotent and race-safe.

    Returns the payment (settled by this call or earlier), or None when the
    session is not one this gateway started.
    """
    payment = payment_of_session(session, checkout.id)
    if payment is None:
        return None
    current = PaymentStatus(payment.status)
    if status not in STATUS_TRANSITIONS.get(current, frozenset()):
        return payment  # the same news again, older news, or nothing new
    now = clock.now()
    values: dict[str, Any] = {"status": status.value, "updated_at": now}
    for column, value in (("amount", checkout.amount_total), ("currency", checkout.currency),
                          ("payment_intent_id", checkout.payment_intent_id),
                          ("subscription_id", checkout.subscription_id)):
        if value is not None:
            values[column] = value
    # Conditional on the status we read: of two messengers racing, exactly
    # one matches the row; the other's UPDATE matches nothing.
    result = session.execute(
        update(Payment).where(Payment.id == payment.id, Payment.status == current.value)
        .values(**values).execution_options(synchronize_session=False))
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.refresh(payment)
        return payment
    session.refresh(payment)
    elicitation = session.get(Elicitation, payment.elicitation_id)
    assert elicitation is not None  # a foreign key guarantees it
    audit.record(session, clock, actor=actor, action=f"payment.{status.value}",
                 target=payment.id, source_ip=source_ip,
                 details={"client_id": payment.client_id, "elicitation_id": elicitation.id,
                          "checkout_session_id": checkout.id, "from": current.value})
    _end_elicitation(session, clock, elicitation, payment, status, actor=actor,
                     source_ip=source_ip)
    return payment


_ENDS: Final = {PaymentStatus.PAID: Status.COMPLETED, PaymentStatus.FAILED: Status.FAILED}


def _end_elicitation(session: Session, clock: Clock, elicitation: Elicitation,
                     payment: Payment, status: PaymentStatus, *, actor: str,
                     source_ip: str | None) -> None:
    now = clock.now()
    if status is PaymentStatus.PROCESSING:
        if elicitation.status not in OPEN:
            return
        hold_open(session, clock, elicitation, now + PROCESSING_HOLD, actor=actor,
                  source_ip=source_ip, reason="payment processing")
        return
    if status is PaymentStatus.EXPIRED:
        # Unpaid and over: the elicitation ends only if its own time is up too;
        # otherwise the user may start again.
        if lifecycle.is_overdue(elicitation, now):
            lifecycle.transition(session, clock, elicitation, Status.EXPIRED, actor=actor,
                                 source_ip=source_ip, event_data=payment_event(payment))
        return
    if elicitation.status not in OPEN:
        _settled_after_end(session, clock, elicitation, payment, actor)
        return
    try:
        lifecycle.transition(session, clock, elicitation, _ENDS[status], actor=actor,
                             source_ip=source_ip, details={"payment_id": payment.id},
                             event_data=payment_event(payment))
    except lifecycle.IllegalTransition:
        _settled_after_end(session, clock, elicitation, payment, actor)


def _settled_after_end(session: Session, clock: Clock, elicitation: Elicitation,
                       payment: Payment, actor: str) -> None:
    # The elicitation was cancelled or expired while Stripe still took the
    # money. Its end stands (the MCP server has been told); the operator must
    # refund, so the trail says so loudly.
    audit.record(session, clock, actor=actor, action="payment.settled_after_end",
                 outcome="failure", target=payment.id,
                 details={"client_id": payment.client_id, "elicitation_id": elicitation.id,
                          "elicitation_status": elicitation.status,
                          "payment_status": payment.status,
                          "checkout_session_id": payment.checkout_session_id})


def payment_event(payment: Payment) -> dict[str, Any]:
    """The ``payment`` object of the webhook to the MCP server."""
    return {"payment": {
        "status": payment.status,
        "amount": payment.amount,
        "currency": payment.currency,
        "mode": payment.mode,
        "checkout_session_id": payment.checkout_session_id,
        "payment_intent_id": payment.payment_intent_id,
        "subscription_id": payment.subscription_id,
    }}


def handle_event(session: Session, clock: Clock, event: dict[str, Any], *,
                 source_ip: str | None = None) -> str:
    """Act on one verified Stripe event, once per event id; what it did."""
    event_id, event_type = event.get("id"), event.get("type")
    if not isinstance(event_id, str) or not isinstance(event_type, str):
        return "ignored"
    if session.get(StripeEvent, event_id) is not None:
        return "duplicate"
    outcome, checkout_id = "ignored", None
    if event_type in HANDLED_EVENTS:
        data = event.get("data")
        obj = data.get("object") if isinstance(data, dict) else None
        if isinstance(obj, dict) and obj.get("object") == "checkout.session":
            checkout = CheckoutSession.from_stripe(obj)
            checkout_id = checkout.id
            status = _event_status(event_type, checkout)
            before = payment_of_session(session, checkout.id)
            before_status = before.status if before is not None else None
            payment = fulfil(session, clock, checkout, status, actor=STRIPE_ACTOR,
                             source_ip=source_ip)
            if payment is not None:
                outcome = "applied" if payment.status != before_status else "unchanged"
    # Inserted in the same transaction as the change: a concurrent delivery of
    # the same event fails on the primary key and its changes roll back.
    session.add(StripeEvent(id=event_id, type=event_type[:100], checkout_session_id=checkout_id,
                            outcome=outcome, received_at=clock.now()))
    return outcome


def _event_status(event_type: str, checkout: CheckoutSession) -> PaymentStatus:
    if event_type == "checkout.session.async_payment_succeeded":
        return PaymentStatus.PAID
    if event_type == "checkout.session.async_payment_failed":
        return PaymentStatus.FAILED
    if event_type == "checkout.session.expired":
        return PaymentStatus.EXPIRED
    return status_of(checkout)  # completed: paid, or awaiting a delayed payment


# --- reading ------------------------------------------------------------------------


def payment_of_session(session: Session, checkout_session_id: str) -> Payment | None:
    """The payment of one Checkout Session, if the gateway started it."""
    return session.scalar(select(Payment).where(
        Payment.checkout_session_id == checkout_session_id))


def latest_payment(session: Session, elicitation_id: str) -> Payment | None:
    """The elicitation's most recent Checkout attempt."""
    return session.scalar(select(Payment).where(Payment.elicitation_id == elicitation_id)
                          .order_by(Payment.attempt.desc()).limit(1))


def payments_of(session: Session, elicitation_id: str) -> list[Payment]:
    """Every Checkout attempt of an elicitation, first first."""
    return list(session.scalars(select(Payment).where(Payment.elicitation_id == elicitation_id)
                                .order_by(Payment.attempt)))


def list_payments(session: Session, *, status: str | None, client_id: str | None,
                  limit: int) -> list[Payment]:
    """Payments, newest first, for the operator."""
    query = select(Payment).order_by(Payment.created_at.desc(), Payment.id.desc()).limit(limit)
    if status is not None:
        query = query.where(Payment.status == status)
    if client_id is not None:
        query = query.where(Payment.client_id == client_id)
    return list(session.scalars(query))


def represent(payment: Payment) -> dict[str, Any]:
    """A payment as the CLI shows it."""
    return {
        "id": payment.id, "elicitation_id": payment.elicitation_id,
        "client_id": payment.client_id, "attempt": payment.attempt, "status": payment.status,
        "amount": payment.amount, "currency": payment.currency, "mode": payment.mode,
        "checkout_session_id": payment.checkout_session_id,
        "payment_intent_id": payment.payment_intent_id,
        "subscription_id": payment.subscription_id,
        "created_at": payment.created_at.isoformat(),
        "updated_at": payment.updated_at.isoformat(),
    }
