"""Writing audit events inside the caller's transaction."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy.orm import Session

from gateway.audit.models import AuditEvent
from gateway.clock import Clock

Outcome = Literal["success", "failure", "denied"]


def record(
    session: Session,
    clock: Clock,
    *,
    actor: str,
    action: str,
    outcome: Outcome = "success",
    target: str | None = None,
    source_ip: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    """Add an audit event to the session's transaction: it commits with the change it records.

    Callers pass identifiers and outcomes, never a secret: the trail is read
    by people who must not learn keys from it.
    """
    session.add(AuditEvent(occurred_at=clock.now(), actor=actor, action=action, target=target,
                           source_ip=source_ip, outcome=outcome, details=details or {}))
