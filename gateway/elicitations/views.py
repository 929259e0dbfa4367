"""The portal page of an elicitation: ``/e/<id>``, behind the subject check.

The check runs on every request, the page and each POST alike: a link
forwarded to someone else shows them a refusal, stores nothing, and is
recorded as ``identity_mismatch``. Only then does anything change.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flask import Blueprint, render_template, request
from sqlalchemy.orm import Session
from werkzeug.wrappers import Response

from gateway import db
from gateway.audit import service as audit
from gateway.credentials import service as credentials
from gateway.credentials import verification
from gateway.credentials.catalog import CredentialType, current_catalog
from gateway.credentials.models import Credential
from gateway.elicitations import lifecycle, service
from gateway.elicitations.lifecycle import TERMINAL, Status
from gateway.elicitations.models import Elicitation
from gateway.elicitations.service import WrongAccount
from gateway.errors import GatewayError
from gateway.identity.sessions import Subject
from gateway.identity.web import actor_of, current_subject, signed_in
from gateway.oauth import pages as connections
from gateway.outbound import OutboundPolicy
from gateway.pagination import timestamp
from gateway.payments import pages as payments
from gateway.vault.keyring import current_keyring
from gateway.vault.sealing import store_sealed
from gateway.web.context import client_name, current_clock, current_settings

blueprint = Blueprint("portal", __name__)

Page = Response | str | tuple[str, int]

ENDED: dict[str, tuple[str, str, str]] = {
    Status.COMPLETED: ("Done", "ok", "This request is complete. Nothing more is needed here."),
    Status.DECLINED: ("Declined", "", "You declined this request. Nothing was stored."),
    Status.FAILED: ("Not completed", "danger", "This request could not be completed."),
    Status.EXPIRED: ("This link has expired", "danger",
                     "The time to answer this request has passed. Go back to the app and "
                     "start again if you still want to."),
    Status.CANCELLED: ("This request was withdrawn", "danger",
                       "The app withdrew this request. Nothing was stored."),
}


@blueprint.app_errorhandler(WrongAccount)
def wrong_account(error: WrongAccount) -> tuple[str, int]:
    """The refusal page: what happened and what to do, never whose link it was.

    Recorded in a transaction of its own: the refusal stands although the
    request's own transaction was rolled back by the error.
    """
    subject = current_subject()
    if subject is not None:
        with db.transaction() as session:
            audit.record(session, current_clock(), actor=actor_of(subject),
                         action="identity_mismatch", outcome="denied",
                         target=error.elicitation_id, source_ip=request.remote_addr,
                         details={"client_id": error.client_id, "method": request.method})
    return render_template("wrong_account.html"), error.status


def open_for(session: Session, subject: Subject, elicitation_id: str) -> Elicitation:
    """The portal's subject check for this request (see :func:`service.open_for`)."""
    return service.open_for(session, current_clock(), subject, elicitation_id,
                            actor=actor_of(subject), source_ip=request.remote_addr)


@blueprint.get("/e/<id:elicitation_id>")
@signed_in()
def show(elicitation_id: str, subject: Subject) -> Page:
    """The request, for the user it was made for; opening it moves it to ``opened``."""
    # Pages are rendered after the commit, never inside the transaction: on
    # SQLite a transaction that writes holds the one write lock until it ends.
    with db.transaction() as session:
        elicitation = open_for(session, subject, elicitation_id)
    if elicitation.status in TERMINAL:
        return ended(elicitation)
    return render(session, elicitation, subject)


@blueprint.post("/e/<id:elicitation_id>")
@signed_in(back="/e/{elicitation_id}")
def answer(elicitation_id: str, subject: Subject) -> Page:
    """Submit the key, or decline; the subject is checked again before anything is written."""
    action = request.form.get("action")
    if action == "submit":
        return _submit(elicitation_id, subject, request.form.get("secret", ""))
    if action != "decline":
        raise GatewayError("This form sent an action the page does not have. Reload the page.")
    with db.transaction() as session:
        elicitation = open_for(session, subject, elicitation_id)
        if elicitation.status not in TERMINAL:
            lifecycle.transition(session, current_clock(), elicitation, Status.DECLINED,
                                 actor=actor_of(subject), source_ip=request.remote_addr)
    return ended(elicitation)


def _submit(elicitation_id: str, subject: Subject, secret: str) -> Page:
    """Check the key, then open the link, store the key and complete it in one transaction.

    The key is checked before anything is written, outside any transaction
    (a live check may take seconds), on the link as read with the subject
    check; the write checks the subject again and sees what another tab did
    meanwhile.
    """
    with db.reading() as session:
        read = service.subject_checked(session, subject, elicitation_id)
    credential_type = _asked_type(read)
    problem = None if credential_type is None else _verified(credential_type, secret)
    credential = None if credential_type is None or problem is not None else \
        credentials.seal_for(current_keyring(), read, credential_type, secret,
                             current_clock().now())
    elicitation = store(elicitation_id, subject, credential)
    if problem is not None and elicitation.status not in TERMINAL:
        return render(session, elicitation, subject, error=problem.detail), problem.status
    return ended(elicitation) if elicitation.status in TERMINAL else \
        render(session, elicitation, subject)


def store(elicitation_id: str, subject: Subject, credential: Credential | None) -> Elicitation:
    """Open the link, store a sealed key or connection and complete it, in one transaction.

    The subject is checked again: the elicitation may have ended, or been
    opened in another tab, while the key was checked or the provider
    answered. Run again when another capture for the same owner, or for this
    elicitation in another tab, won the race, and sealed again when its key
    version was retired meanwhile. Without a credential (the key was
    refused), the link is only opened.
    """

    def attempt() -> Elicitation:
        with db.transaction() as session:
            current = open_for(session, subject, elicitation_id)
            if current.status in TERMINAL or credential is None:
                return current
            return credentials.capture(session, current_clock(), current, credential,
                                       actor=actor_of(subject), source_ip=request.remote_addr)

    return store_sealed(current_keyring(),
                        lambda: db.retry_on_conflict(attempt, attempts=credentials.OWNER_RACES,
                                                     conflict=credentials.CaptureRaced),
                        seal_again=None if credential is None else credential.seal_again)


def _asked_type(elicitation: Elicitation) -> CredentialType | None:
    """The type of key the elicitation asks for; None once it has ended."""
    if elicitation.status in TERMINAL:
        return None
    if elicitation.kind != "api_key":
        raise GatewayError("This request is not for a key. Reload the page.")
    credential_type = current_catalog().get(elicitation.credential_type or "")
    if credential_type is None:
        raise GatewayError("This kind of key is no longer accepted here. Go back to the app.")
    return credential_type


def _verified(credential_type: CredentialType, secret: str) -> GatewayError | None:
    """What is wrong with the key: its shape first, then by the type's live check."""
    try:
        credentials.check_shape(credential_type, secret)
        if credential_type.check is not None:
            verification.require_valid(OutboundPolicy.from_settings(current_settings()),
                                       credential_type.check, credential_type.label, secret)
    except GatewayError as error:
        return error
    return None


def render(session: Session, elicitation: Elicitation, subject: Subject,
           error: str | None = None) -> str:
    """The page of an open elicitation: the key form, the connect button or the checkout."""
    context: dict[str, Any] = {
        "elicitation": elicitation, "subject": subject, "error": error,
        "client_name": client_name(elicitation.client_id),
        "expires": Expiry.of(elicitation.expires_at, current_clock().now()),
    }
    if elicitation.kind == "api_key":
        credential_type = current_catalog().get(elicitation.credential_type or "")
        label = credential_type.label if credential_type else "API key"
        return render_template("elicitation_api_key.html", asked=f"your {label}",
                               credential_type=credential_type, **context)
    if elicitation.kind == "oauth":
        return connections.connect_page(context, connections.connection_type(elicitation))
    return payments.checkout_page(session, context)


def ended(elicitation: Elicitation) -> str:
    """The page of an elicitation that has ended: done, declined, expired or withdrawn."""
    heading, tone, text = ENDED[Status(elicitation.status)]
    # A stored key can be taken back later: say where, on the page that stored it.
    revocable = elicitation.status == Status.COMPLETED and elicitation.kind == "api_key"
    return render_template("elicitation_ended.html", heading=heading, tone=tone, text=text,
                           revocable=revocable, client_name=client_name(elicitation.client_id))


@dataclass(frozen=True, slots=True)
class Expiry:
    """When a link expires, as pages show it (the ``expiry`` macro of ``_portal.html``).

    The server knows no reader's time zone, so it writes UTC; the page's
    script adds the reader's local time from ``iso``.
    """

    iso: str  # for <time datetime>
    utc: str  # "14:05 UTC", or with the date when it is hours away
    remaining: str  # "in 12 minutes"

    @classmethod
    def of(cls, expires_at: datetime, now: datetime) -> Expiry:
        minutes = max(0, int((expires_at - now).total_seconds() // 60))
        if minutes < 1:
            remaining = "in less than a minute"
        elif minutes < 120:
            remaining = f"in {minutes} minute{'s' if minutes != 1 else ''}"
        else:
            remaining = f"in {minutes // 60} hours"
        when = f"{expires_at:%H:%M} UTC" if minutes < 120 else f"{expires_at:%Y-%m-%d %H:%M} UTC"
        return cls(timestamp(expires_at), when, remaining)
