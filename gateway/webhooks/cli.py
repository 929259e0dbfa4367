"""``gateway webhooks``: see, redeliver and test webhook deliveries."""

from __future__ import annotations

import click

from gateway import cli
from gateway.clients.service import get_client
from gateway.clock import SystemClock
from gateway.outbound import OutboundPolicy
from gateway.pagination import timestamp
from gateway.webhooks import service

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.group(cls=cli.Group)
def webhooks() -> None:
    """Webhook events sent to MCP servers."""


@webhooks.command(name="list")
@click.option("--status", type=click.Choice(service.STATUSES))
@click.option("--client", "client_id", help="Only this client's (by id).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@json_option
def list_events(status: str | None, client_id: str | None, limit: int, as_json: bool) -> None:
    """Events, newest first."""
    with cli.transaction() as session:
        rows = [service.represent(e) for e in service.list_events(
            session, status=status, client_id=client_id, limit=limit)]
    if as_json:
        cli.echo_json(rows)
        return
    cli.echo_table(rows, ["id", "client_id", "type", "status", "attempts", "created_at",
                          "last_error"])


@webhooks.command()
@click.argument("event_id")
@json_option
def show(event_id: str, as_json: bool) -> None:
    """One event and every attempt to deliver it."""
    with cli.transaction() as session:
        event = service.get_event(session, event_id)
        summary = service.represent(event)
        attempts = [{"attempt": a.number, "started_at": timestamp(a.started_at),
                     "status_code": a.status_code, "latency_ms": a.latency_ms,
                     "outcome": a.outcome, "error": a.error}
                    for a in service.attempts_of(session, event_id)]
        body = event.body
    if as_json:
        cli.echo_json({**summary, "body": body, "attempt_log": attempts})
        return
    for key, value in summary.items():
        click.echo(f"{key + ':':17}{cli.cell(value)}")
    click.echo(f"{'body:':17}{cli.cell(body)}")
    click.echo("attempts:")
    cli.echo_table(attempts, ["attempt", "started_at", "status_code", "latency_ms", "outcome",
                              "error"])


@webhooks.command()
@click.argument("event_id")
def redeliver(event_id: str) -> None:
    """Send an event again, with the same webhook-id and body."""
    with cli.transaction() as session:
        service.redeliver(session, SystemClock(), event_id, actor=cli.operator())
    click.echo(f"event {event_id} queued for delivery")


@webhooks.command()
@click.argument("client")
@json_option
def test(client: str, as_json: bool) -> None:
    """Send a signed ping event to a client's webhook URL and show what came back."""
    settings = cli.settings()
    keyring = cli.key_versions()
    with cli.transaction() as session:
        found = get_client(session, client)
        outcome = service.send_ping(session, SystemClock(), keyring,
                                    OutboundPolicy.from_settings(settings), found,
                                    actor=cli.operator())
    if as_json:
        cli.echo_json(outcome)
    else:
        for key, value in outcome.items():
            click.echo(f"{key + ':':13}{cli.cell(value)}")
    if not outcome["delivered"]:
        raise SystemExit(1)
