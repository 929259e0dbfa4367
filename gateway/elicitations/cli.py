"""``gateway elicitations``: look at and cancel elicitations, across clients."""

from __future__ import annotations

from typing import Any

import click

from gateway import cli
from gateway.clock import SystemClock
from gateway.elicitations import service
from gateway.elicitations.lifecycle import Status
from gateway.elicitations.models import Elicitation
from gateway.payments import service as payments

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.group(cls=cli.Group)
def elicitations() -> None:
    """Elicitations of every client."""


@elicitations.command(name="list")
@click.option("--client", "client_id", help="Only this client's (by id).")
@click.option("--status", type=click.Choice([s.value for s in Status]))
@click.option("--kind", type=click.Choice(["api_key", "oauth", "payment"]))
@click.option("--subject-iss")
@click.option("--subject-sub")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, service.MAX_PAGE))
@click.option("--cursor", help="Continue after a previous page.")
@json_option
def list_elicitations(client_id: str | None, status: str | None, kind: str | None,
                      subject_iss: str | None, subject_sub: str | None, limit: int,
                      cursor: str | None, as_json: bool) -> None:
    """Elicitations, newest first."""
    filters = service.Filters(status=status, kind=kind, subject_iss=subject_iss,
                              subject_sub=subject_sub)
    clock = SystemClock()
    with cli.transaction() as session:
        page, next_cursor = service.list_page(session, clock, client_id, filters, cursor, limit)
        rows = [_row(e, clock) for e in page]
    if as_json:
        cli.echo_json({"items": rows, "next_cursor": next_cursor})
        return
    cli.echo_table(rows, ["id", "client_id", "status", "kind", "credential_type",
                          "subject_sub", "created_at", "expires_at"])
    if next_cursor:
        click.echo(f"more: --cursor {next_cursor}")


@elicitations.command()
@click.argument("elicitation_id")
@json_option
def show(elicitation_id: str, as_json: bool) -> None:
    """One elicitation, whole."""
    clock = SystemClock()
    with cli.transaction() as session:
        elicitation = service.find(session, clock, elicitation_id)
        row = _row(elicitation, clock)
        if elicitation.kind == "payment":
            row["payments"] = [payments.represent(p)
                               for p in payments.payments_of(session, elicitation.id)]
    if as_json:
        cli.echo_json(row)
        return
    for key, value in row.items():
        if key not in ("mcp", "payments"):
            click.echo(f"{key + ':':17}{cli.cell(value)}")
    for payment in row.get("payments", []):
        click.echo(f"payment {payment['attempt']}:{'':7}{payment['status']}  "
                   f"{cli.cell(payment['amount'])} {cli.cell(payment['currency'])}  "
                   f"{payment['checkout_session_id']}  "
                   f"{cli.cell(payment['payment_intent_id'] or payment['subscription_id'])}")


@elicitations.command()
@click.argument("elicitation_id")
def cancel(elicitation_id: str) -> None:
    """Cancel an open elicitation; its link stops working at once."""
    clock = SystemClock()
    with cli.transaction() as session:
        elicitation = service.find(session, clock, elicitation_id)
        service.cancel(session, clock, elicitation, actor=cli.operator())
    click.echo(f"elicitation {elicitation_id} cancelled")


def _row(elicitation: Elicitation, clock: SystemClock) -> dict[str, Any]:
    view = service.represent(elicitation, cli.settings().public_url, clock.now())
    subject = view.pop("subject")
    return {"id": view.pop("id"), "client_id": elicitation.client_id,
            "subject_iss": subject["iss"], "subject_sub": subject["sub"], **view}
