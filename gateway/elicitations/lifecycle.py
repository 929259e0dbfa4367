"""The state machine of an elicitation, enforced in one place.

    pending ──open──▶ opened ──submit/paid──▶ completed
       │                │ ├──decline────────▶ declined
       │                │ └──payment failed─▶ failed
       └──── TTL passes / client cancels ────▶ expired / cancelled

Each transition is one conditional UPDATE (``WHERE status = <the status we
read>``, a statement built once, run on the transaction's connection) in the
caller's transaction, with its audit row, its outbox row when
it ends the elicitation, and a change signal that wakes long-polls everywhere
once the transaction commits. Two requests
racing to end the same elicitation cannot both win: the loser's UPDATE
matches no row and it gets a conflict.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from gateway import changes
from gateway.audit import service as audit
from gateway.clients import service as clients
from gateway.clock import Clock
from gateway.elicitations.models import Elicitation
from gateway.errors import Conflict
from gateway.webhooks import outbox


class Status(StrEnum):
    PENDING = "pending"
    OPENED = "opened"
    COMPLETED = "completed"
    DECLINED = "declined"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


OPEN: Final = frozenset({Status.PENDING, Status.OPENED})
TERMINAL: Final = frozenset(Status) - OPEN

TRANSITIONS: Final[dict[Status, frozenset[Status]]] = {
    Status.PENDING: frozenset({Status.OPENED, Status.EXPIRED, Status.CANCELLED}),
    Status.OPENED: frozenset({Status.COMPLETED, Status.DECLINED, Status.FAILED,
                              Status.EXPIRED, Status.CANCELLED}),
}

CHANGE_TOPIC: Final = "elicitation"


class IllegalTransition(Conflict):
    code = "illegal-transition"
    title = "Not possible in this state"


def is_overdue(elicitation: Elicitation, now: datetime) -> bool:
    """Whether the elicitation is still open although its time is up."""
    return elicitation.status in OPEN and now >= elicitation.expires_at


def transition(
    session: Session, clock: Clock, elicitation: Elicitation, to: Status, *,
    actor: str, source_ip: str | None = None, details: dict[str, Any] | None = None,
    event_data: dict[str, Any] | None = None,
) -> Elicitation:
    """Move the elicitation to ``to``, or raise IllegalTransition and change nothing.

    An end state also puts its webhook event in the outbox, in this same
    transaction; ``event_data`` adds to its ``data`` (the credential's id,
    type and hint, a payment's outcome).
    """
    now = clock.now()
    current = Status(elicitation.status)
    if to is not Status.EXPIRED and is_overdue(elicitation, now):
        raise IllegalTransition("this elicitation has expired",
                                elicitation_status=Status.EXPIRED.value)
    if to not in TRANSITIONS.get(current, frozenset()):
        raise IllegalTransition(f"an elicitation that is {current} cannot become {to}",
                                elicitation_status=current.value)
    # Conditional on the status read: of two requests ending it at once, the
    # second matches no row. Built once, run on the transaction's connection.
    connection = session.connection()
    stamped = "opened_at" if to is Status.OPENED else "ended_at"
    moved = connection.execute(_OPEN if to is Status.OPENED else _END, {
        "elicitation_id": elicitation.id, "from_status": current.value,
        "to_status": to.value, "at": now}).first()
    if moved is None:
        status = connection.execute(_STATUS, {"elicitation_id": elicitation.id}).scalar_one()
        set_committed_value(elicitation, "status", status)
        raise IllegalTransition(f"the elicitation became {status} meanwhile",
                                elicitation_status=status)
    # The object follows the row as it now is, without becoming a change of
    # its own: a session that holds it writes nothing more at its flush.
    set_committed_value(elicitation, "status", to.value)
    set_committed_value(elicitation, stamped, now)
    audit.record(session, clock, actor=actor, action=f"elicitation.{to.value}",
                 target=elicitation.id, source_ip=source_ip,
                 details={"client_id": elicitation.client_id, "from": current.value,
                          **(details or {})})
    changes.announce(session, CHANGE_TOPIC)
    if to in TERMINAL:
        _enqueue_event(session, clock, elicitation, event_data or {})
    return elicitation


_MOVED: Final = (Elicitation.id == bindparam("elicitation_id")) & \
    (Elicitation.status == bindparam("from_status"))
_OPEN: Final = update(Elicitation).where(_MOVED).values(
    {Elicitation.status: bindparam("to_status"), Elicitation.opened_at: bindparam("at")}
).returning(Elicitation.id)
_END: Final = update(Elicitation).where(_MOVED).values(
    {Elicitation.status: bindparam("to_status"), Elicitation.ended_at: bindparam("at")}
).returning(Elicitation.id)
_STATUS: Final = select(Elicitation.status).where(Elicitation.id == bindparam("elicitation_id"))


def _enqueue_event(session: Session, clock: Clock, elicitation: Elicitation,
                   extra: dict[str, Any]) -> None:
    webhook_url = clients.webhook_url_of(session, elicitation.client_id)
    outbox.enqueue(session, clock, elicitation.client_id, webhook_url,
                   f"elicitation.{elicitation.status}", event_data(elicitation, extra),
                   elicitation_id=elicitation.id)


def event_data(elicitation: Elicitation, extra: dict[str, Any]) -> dict[str, Any]:
    """The ``data`` of the webhook event an elicitation's end sends, as its status now is."""
    return {
        "elicitation_id": elicitation.id,
        "status": elicitation.status,
        "kind": elicitation.kind,
        "subject": {"iss": elicitation.subject_iss, "sub": elicitation.subject_sub},
        "metadata": elicitation.metadata_,
        **extra,
    }
