"""``gateway payments``: Stripe Checkout attempts of every client, by status."""

from __future__ import annotations

import click

from gateway import cli
from gateway.payments import service
from gateway.payments.service import PaymentStatus

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.group(cls=cli.Group)
def payments() -> None:
    """Payments made through Stripe Checkout."""


@payments.command(name="list")
@click.option("--status", type=click.Choice([s.value for s in PaymentStatus]))
@click.option("--client", "client_id", help="Only this client's (by id).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500))
@json_option
def list_payments(status: str | None, client_id: str | None, limit: int,
                  as_json: bool) -> None:
    """Payments, newest first."""
    with cli.transaction() as session:
        rows = [service.represent(p) for p in service.list_payments(
            session, status=status, client_id=client_id, limit=limit)]
    if as_json:
        cli.echo_json({"items": rows})
        return
    cli.echo_table(rows, ["id", "elicitation_id", "status", "amount", "currency", "mode",
                          "checkout_session_id", "created_at"])
