"""The portal page of an elicitation: ``/e/<id>``, behind the subject check.

The check runs on every request, the page and each POST alike: a link
forwarded to someone else shows them a refusal, stores nothing, and is
recorded as ``identity_mismatch``. Only then does anything change.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any, Final, NoReturn

from flask import Blueprint, current_app, render_template, request
from sqlalchemy.orm import Session
from werkzeug.wrappers import Response

from gateway import db
from gateway.audit import service as audit
from gateway.credentials import service as credentials
from gateway.credentials import verification
from gateway.credentials.catalog import CredentialType, current_catalog
from gateway.elicitations import lifecycle, service
from gateway.elicitations.lifecycle import TERMINAL, Status
from gateway.elicitations.models import Elicitation, ElicitationSnapshot
from gateway.errors import GatewayError, NotFound
from gateway.identity.sessions import Subject
from gateway.identity.web import actor_of, current_subject, login_redirect
from gateway.outbound import OutboundPolicy
from gateway.pagination import timestamp
from gateway.payments import pages as payments
from gateway.vault.keyring import current_keyring
from gateway.web.context import client_name, current_clock

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


NO_SUCH_LINK: Final = ("This link is not valid. Go back to the app that sent it and open its "
                       "link again.")


class WrongAccount(GatewayError):
    status = 403
    code = "wrong-account"
    title = "This link is for another account"


@blueprint.errorhandler(WrongAccount)
def wrong_account(error: WrongAccount) -> tuple[str, int]:
    """The refusal page: what happened and what to do, never whose link it was."""
    return render_template("wrong_account.html"), error.status


@blueprint.get("/e/<id:elicitation_id>")
def show(elicitation_id: str) -> Page:
    """The request, for the user it was made for; opening it moves it to ``opened``."""
    subject = current_subject()
    if subject is None:
        return login_redirect(request.path)
    # Pages are rendered after the commit, never inside the transaction: on
    # SQLite a transaction that wrote holds the one write lock until it ends.
    with db.transaction() as session:
        elicitation = _open(session, elicitation_id, subject)
    if elicitation.status in TERMINAL:
        return _ended(elicitation)
    return _render(session, elicitation, subject)


@blueprint.post("/e/<id:elicitation_id>")
def answer(elicitation_id: str) -> Page:
    """Submit the key, or decline; the subject is checked again before anything is written."""
    subject = current_subject()
    if subject is None:
        return login_redirect(request.path)
    action = request.form.get("action")
    if action == "submit":
        return _submit(elicitation_id, subject, request.form.get("secret", ""))
    if action != "decline":
        raise GatewayError("This form sent an action the page does not have. Reload the page.")
    with db.transaction() as session:
        elicitation = _open(session, elicitation_id, subject)
        if elicitation.status not in TERMINAL:
            lifecycle.transition(session, current_clock(), elicitation, Status.DECLINED,
                                 actor=actor_of(subject), source_ip=request.remote_addr)
    return _ended(elicitation)


def _submit(elicitation_id: str, subject: Subject, secret: str) -> Page:
    """Check the key, then seal it, store it and complete the elicitation in one change."""
    elicitation = _read(elicitation_id, subject)
    credential_type = _asked_type(elicitation)
    if credential_type is None:
        return _ended(elicitation)
    # Checked outside any transaction: a live check may take seconds.
    error = _verified(credential_type, secret)
    if error is not None:
        return _refused(elicitation_id, subject, error)
    credential = credentials.seal_for(current_keyring(), elicitation, credential_type, secret,
                                      current_clock().now())
    while not credentials.capture(current_clock(), elicitation, credential,
                                  actor=actor_of(subject), source_ip=request.remote_addr):
        # It moved on since it was read: ended (nothing more to store), or
        # opened in another tab (stored now, as opened). At most twice.
        elicitation = _read(elicitation_id, subject)
        if elicitation.status in TERMINAL:
            return _ended(elicitation)
    return _ended(replace(elicitation, status=Status.COMPLETED.value))


def _asked_type(elicitation: Elicitation | ElicitationSnapshot) -> CredentialType | None:
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
            verification.require_valid(_outbound(), credential_type.check,
                                       credential_type.label, secret)
    except GatewayError as error:
        return error
    return None


def _refused(elicitation_id: str, subject: Subject, error: GatewayError) -> Page:
    """The form again, saying what is wrong with the key (never repeating it)."""
    with db.transaction() as session:
        elicitation = _open(session, elicitation_id, subject)
    if elicitation.status in TERMINAL:
        return _ended(elicitation)
    return _render(session, elicitation, subject, error=error.detail), error.status


def _read(elicitation_id: str, subject: Subject) -> ElicitationSnapshot:
    """As :func:`_checked`, read outside any transaction while nothing needs changing."""
    elicitation = service.peek_any(db.autocommit(), elicitation_id)
    if elicitation is None:
        raise NotFound(NO_SUCH_LINK)
    if (subject.iss, subject.sub) != (elicitation.subject_iss, elicitation.subject_sub):
        _refuse(elicitation, subject)
    if lifecycle.is_overdue(elicitation, current_clock().now()):
        with db.transaction() as session:  # marked expired
            return ElicitationSnapshot.of(_checked(session, elicitation_id, subject))
    return elicitation


def _open(session: Session, elicitation_id: str, subject: Subject) -> Elicitation:
    """The subject-checked elicitation, moved to ``opened`` if it was still pending."""
    elicitation = _checked(session, elicitation_id, subject)
    _mark_opened(session, elicitation, subject)
    return elicitation


def _mark_opened(session: Session, elicitation: Elicitation, subject: Subject) -> None:
    """Move a checked elicitation that is still pending to ``opened``."""
    if elicitation.status == Status.PENDING:
        lifecycle.transition(session, current_clock(), elicitation, Status.OPENED,
                             actor=actor_of(subject), source_ip=request.remote_addr)


def _outbound() -> OutboundPolicy:
    return OutboundPolicy.from_settings(current_app.extensions["gateway.settings"])


def _checked(session: Session, elicitation_id: str, subject: Subject) -> Elicitation:
    """The elicitation, if it exists and was made for this subject; expired if overdue."""
    elicitation = session.get(Elicitation, elicitation_id)
    if elicitation is None:
        raise NotFound(NO_SUCH_LINK)
    if (subject.iss, subject.sub) != (elicitation.subject_iss, elicitation.subject_sub):
        _refuse(elicitation, subject)
    service.expire_if_overdue(session, current_clock(), elicitation)
    return elicitation


def _refuse(elicitation: Elicitation | ElicitationSnapshot, subject: Subject) -> NoReturn:
    # Recorded in a transaction of its own: the refusal stands even though
    # the request's own transaction is rolled back by the error.
    with db.engine().begin() as connection, Session(bind=connection) as record:
        audit.record(record, current_clock(), actor=actor_of(subject), action="identity_mismatch",
                     outcome="denied", target=elicitation.id, source_ip=request.remote_addr,
                     details={"client_id": elicitation.client_id, "method": request.method})
        record.flush()
    raise WrongAccount("This link was created for another account.")


def _render(session: Session, elicitation: Elicitation, subject: Subject,
            error: str | None = None) -> str:
    context: dict[str, Any] = {
        "elicitation": elicitation, "subject": subject, "error": error,
        "client_name": client_name(elicitation.client_id),
        "expires_iso": timestamp(elicitation.expires_at),
        "expires_text": _expiry_text(elicitation.expires_at, current_clock().now()),
    }
    if elicitation.kind == "api_key":
        credential_type = current_catalog().get(elicitation.credential_type or "")
        label = credential_type.label if credential_type else "an API key"
        return render_template("elicitation_api_key.html", asked=f"your {label}",
                               credential_type=credential_type, **context)
    return payments.checkout_page(session, context)


def _ended(elicitation: Elicitation | ElicitationSnapshot) -> str:
    heading, tone, text = ENDED[Status(elicitation.status)]
    return render_template("elicitation_ended.html", heading=heading, tone=tone, text=text,
                           client_name=client_name(elicitation.client_id))


def _expiry_text(expires_at: datetime, now: datetime) -> str:
    minutes = max(0, int((expires_at - now).total_seconds() // 60))
    when = expires_at.strftime("%H:%M UTC")
    if minutes < 1:
        return f"{when} (in less than a minute)"
    if minutes < 120:
        return f"{when} (in {minutes} minute{'s' if minutes != 1 else ''})"
    return f"{expires_at:%Y-%m-%d %H:%M} UTC (in {minutes // 60} hours)"
