"""``gateway audit``: read the audit trail."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import get_args

import click
from sqlalchemy import select

from gateway import cli
from gateway.audit.models import AuditEvent
from gateway.audit.service import Outcome
from gateway.pagination import timestamp

_AGO = re.compile(r"([1-9][0-9]*)([mhd])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


def _since(text: str | None) -> datetime | None:
    """``30m``, ``12h``, ``7d`` ago, or an ISO date/time (UTC when it names no zone)."""
    if text is None:
        return None
    match = _AGO.fullmatch(text)
    if match:
        return datetime.now(UTC) - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        cli.fail(f"--since takes 30m, 12h, 7d or an ISO date such as 2026-12-01; got {text!r}")
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@click.command()
@click.option("--since", help="Only records from then on: 30m, 12h, 7d or an ISO date.")
@click.option("--actor", help="Only this actor (e.g. operator:root, client:cl_…).")
@click.option("--action", help="Only this action, or a prefix ending in '.' (e.g. login.).")
@click.option("--target", help="Only records about this (e.g. el_…, cl_…, a user name).")
@click.option("--outcome", type=click.Choice(get_args(Outcome)), help="Only this outcome.")
@click.option("--limit", default=200, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def audit(since: str | None, actor: str | None, action: str | None, target: str | None,
          outcome: str | None, limit: int, as_json: bool) -> None:
    """Security events, oldest first: who did what to which target, from where."""
    query = select(AuditEvent).order_by(AuditEvent.occurred_at.desc(), AuditEvent.id.desc())
    moment = _since(since)
    if moment is not None:
        query = query.where(AuditEvent.occurred_at >= moment)
    for column, wanted in ((AuditEvent.actor, actor), (AuditEvent.target, target),
                           (AuditEvent.outcome, outcome)):
        if wanted:
            query = query.where(column == wanted)
    if action:
        query = query.where(AuditEvent.action.startswith(action) if action.endswith(".")
                            else AuditEvent.action == action)
    with cli.transaction() as session:
        rows = [{"time": timestamp(e.occurred_at), "actor": e.actor, "action": e.action,
                 "target": e.target, "source_ip": e.source_ip, "outcome": e.outcome,
                 "details": e.details}
                for e in reversed(session.scalars(query.limit(limit)).all())]
    if as_json:
        cli.echo_json(rows)
        return
    # cli.cell escapes control characters: text a user or client chose
    # (a user name, a message) cannot forge a line or recolour the terminal.
    cli.echo_table(rows, ["time", "actor", "action", "target", "source_ip", "outcome"])
