"""``gateway status``: the state of this gateway at a glance."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

import click
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from gateway import cli, migrations, preflight
from gateway.audit.models import AuditEvent
from gateway.clients.models import Client, WebhookSecret
from gateway.clients.service import current_webhook_secrets, webhook_secret_binding
from gateway.clock import SystemClock
from gateway.credentials.catalog import CatalogError, catalog_of
from gateway.credentials.models import Credential
from gateway.credentials.service import binding as credential_binding
from gateway.db import for_reads, make_engine
from gateway.elicitations.lifecycle import Status
from gateway.elicitations.models import Elicitation
from gateway.oauth.provider import redirect_uri_of
from gateway.oauth.refresh import CLIENT_REFUSED
from gateway.outbound import OutboundPolicy
from gateway.pagination import timestamp
from gateway.settings import Settings, SettingsError
from gateway.vault import versions
from gateway.vault.envelope import VaultError, reveal_plaintext
from gateway.vault.keyring import Keyring, KeyringError, load_keyring
from gateway.vault.versions import KeyVersions
from gateway.webhooks import service as webhooks
from gateway.webhooks.dispatcher import CANNOT_SIGN
from gateway.webhooks.models import WebhookEvent


def collect() -> dict[str, Any]:
    """Every figure ``gateway status`` shows."""
    settings = cli.settings()
    engine = make_engine(settings.database_url)
    report: dict[str, Any] = {"database": {"url": engine.url.render_as_string(
        hide_password=True), "reachable": False}}
    try:
        current = migrations.current_revisions(engine)
        report["database"].update(reachable=True, revision=sorted(current),
                                  current=current == migrations.head_revisions())
        if report["database"]["current"]:
            report.update(_figures(engine, timedelta(seconds=settings.webhook_lease_seconds)))
    except SQLAlchemyError as error:
        report["database"]["error"] = type(error).__name__
    finally:
        engine.dispose()
    try:
        root = load_keyring(settings)
    except KeyringError as error:
        report.setdefault("keys", {})["error"] = str(error)
    else:
        keys = report.setdefault("keys", {})
        keys["keyring_versions"] = sorted(root.keys, reverse=True)
        keys["root"] = root.current_version
        keys["current"] = root.current_version
        if report["database"].get("current"):
            _check_key_versions(settings, root, keys)
        if "webhooks" in report:
            report["webhooks"]["unsigned_clients"] = _clients_that_cannot_sign(settings, root)
    report["configuration"] = [problem.as_json() for problem in _configuration_problems(
        settings, with_clients=bool(report["database"].get("current")))]
    report["oauth"] = _oauth(settings)
    report["public_url"] = settings.public_url
    return report


def _oauth(settings: Settings) -> dict[str, Any]:
    """The OAuth types, and the redirect URI to register with each one's provider."""
    try:
        types = catalog_of(settings).ids_of("oauth")
    except (CatalogError, SettingsError) as error:
        return {"error": str(error)}
    return {"types": types, "redirect_uris": {
        type_id: redirect_uri_of(settings.public_url, type_id) for type_id in types}}


def _configuration_problems(settings: Settings, *, with_clients: bool) -> list[preflight.Problem]:
    """What `gateway serve` would refuse to start with or warn of (gateway.preflight)."""
    try:
        policy = OutboundPolicy.from_settings(settings)
    except SettingsError as error:
        return [preflight.Problem(error.key, str(error).removeprefix(f"{error.key}: "),
                        refuses_start=True)]
    engine = make_engine(settings.database_url) if with_clients else None
    try:
        return preflight.problems(settings, policy, engine)
    finally:
        if engine is not None:
            engine.dispose()


def _clients_that_cannot_sign(settings: Settings, root: Keyring) -> list[str]:
    """The clients with a webhook URL whose signing secrets do not open; nothing is kept."""
    engine = make_engine(settings.database_url)
    failed: list[str] = []
    try:
        keyring = KeyVersions(engine, lambda: root, SystemClock(), role="status").snapshot()
        with Session(for_reads(engine)) as session:
            for client in session.scalars(select(Client).where(Client.webhook_url.is_not(None))
                                          .order_by(Client.created_at, Client.id)):
                try:
                    current_webhook_secrets(session, SystemClock(), keyring, client)
                except (VaultError, KeyringError):
                    failed.append(client.id)
    except KeyringError:
        return failed  # the key versions do not open: _check_key_versions says so
    finally:
        engine.dispose()
    return failed


def _check_key_versions(settings: Any, root: Keyring, keys: dict[str, Any]) -> None:
    """Read the key versions and open one stored secret per version in use.

    A restored database with another instance's keyring looks healthy in
    every count; only opening a secret tells. Nothing opened is kept or shown.
    Also which version each running process wraps new secrets with.
    """
    engine = make_engine(settings.database_url)
    failed: list[str] = []
    unopened: list[str] = []
    try:
        keyring = KeyVersions(engine, lambda: root, SystemClock(), role="status").snapshot()
        keys["current"] = keyring.current_version
        with Session(engine) as session:
            carried = any(row.carried_over for row in versions.stored(session).values())
            keys["stored_in"] = "database" if carried else "keyring"
            keys["instances"] = [
                {"instance": row.instance, "role": row.role, "wraps_with": f"v{row.key_version}",
                 "seen_at": timestamp(row.seen_at)}
                for row in versions.fresh_heartbeats(session, SystemClock().now())]
            for version in sorted({int(v[1:]) for v in keys.get("in_use", {})}):
                opened, closed = _try_to_open(session, keyring, version)
                # Key versions kept in the database opened with this root key,
                # so the keyring is right; else only secrets can tell, and it
                # is wrong when none of them opens. A few that do not open
                # beside others that do were altered, not sealed elsewhere.
                if closed and (opened or carried):
                    unopened.append(f"v{version}")
                elif closed:
                    failed.append(f"v{version}")
    except KeyringError as error:
        keys["error"] = str(error)
        return
    finally:
        engine.dispose()
    problems = []
    if failed:
        problems.append(f"this keyring does not open the stored secrets of key version "
                        f"{', '.join(failed)}: wrong keyring for this database?")
    if unopened:
        problems.append(f"some stored secrets of key version {', '.join(unopened)} do not "
                        "open (altered, or sealed under a key no longer there); "
                        "`gateway keys rewrap` names each")
    if problems:
        keys["error"] = "; ".join(problems)


# How many stored secrets of each kind status tries to open, per key version.
SAMPLE: Final = 20


def _try_to_open(session: Session, keyring: Keyring, version: int) -> tuple[int, int]:
    """Of a few stored secrets under ``version``: how many open, how many do not."""
    opened = closed = 0
    rows: list[tuple[Any, bytes]] = [
        (c, credential_binding(c)) for c in session.scalars(
            select(Credential).where(Credential.key_version == version).limit(SAMPLE))]
    rows += [(s, webhook_secret_binding(s)) for s in session.scalars(
        select(WebhookSecret).where(WebhookSecret.key_version == version).limit(SAMPLE))]
    for row, binding in rows:
        try:
            reveal_plaintext(keyring, row.envelope, binding)
            opened += 1
        except (VaultError, KeyringError):
            closed += 1
    return opened, closed


def _figures(engine: Any, lease: timedelta) -> dict[str, Any]:
    with for_reads(engine).connect() as connection:
        states = dict.fromkeys((s.value for s in Status), 0)
        states.update(_counts(connection, Elicitation.status))
        outbox = _counts(connection, WebhookEvent.status)
        oldest = connection.scalar(select(func.min(WebhookEvent.next_attempt_at)).where(
            WebhookEvent.status.in_(["pending", "delivering"])))
        cannot_sign = connection.scalar(select(func.count()).where(
            WebhookEvent.status.in_(["pending", "delivering", "dead"]),
            WebhookEvent.last_error == CANNOT_SIGN))
        stalled = webhooks.stalled(connection, SystemClock().now(), lease)
        last_poll = webhooks.last_poll(connection)
        in_use: dict[str, int] = {}
        for model in (Credential, WebhookSecret):
            for version, count in connection.execute(
                    select(model.key_version, func.count()).group_by(model.key_version)):
                in_use[f"v{version}"] = in_use.get(f"v{version}", 0) + count
        # When each OAuth type's provider last refused the gateway's own client
        # (invalid_client): the operator's to fix, the users' connections kept.
        refused = connection.execute(
            select(AuditEvent.target, func.max(AuditEvent.occurred_at))
            .where(AuditEvent.action == CLIENT_REFUSED).group_by(AuditEvent.target)).all()
    return {
        "oauth_client_refused": {type_id: timestamp(at) for type_id, at in refused},
        "elicitations": states,
        "webhooks": {"backlog": outbox.get("pending", 0) + outbox.get("delivering", 0),
                     "oldest_due": timestamp(oldest), "dead": outbox.get("dead", 0),
                     "delivered": outbox.get("delivered", 0),
                     "failing_unsigned": cannot_sign, "worker_last_poll": timestamp(last_poll),
                     "stalled": stalled},
        "keys": {"in_use": in_use},
    }


def _counts(connection: Any, column: Any) -> dict[str, int]:
    rows = connection.execute(select(column, func.count()).group_by(column)).all()
    return {row[0]: row[1] for row in rows}


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def status(as_json: bool) -> None:
    """Database, schema, keys, webhook backlog and elicitations, at a glance."""
    report = collect()
    if as_json:
        cli.echo_json(report)
    else:
        _print(report)
    hooks = report.get("webhooks", {})
    healthy = (report["database"].get("current") and "error" not in report.get("keys", {})
               and not hooks.get("stalled") and not hooks.get("unsigned_clients")
               and not report["configuration"])
    if not healthy:
        raise SystemExit(1)


def _line(label: str, text: str, colour: str | None = None) -> None:
    click.echo(f"{label + ':':14}" + click.style(text, fg=colour))


def _print(report: dict[str, Any]) -> None:
    _print_figures(report)
    # Each names the setting to change; red for what `gateway serve` refuses to start with.
    for problem in report["configuration"]:
        _line("config", f"{problem['setting']}: {problem['problem']}",
              "red" if problem["refuses_start"] else "yellow")


def _print_figures(report: dict[str, Any]) -> None:
    _line("public URL", report["public_url"])
    database = report["database"]
    if not database["reachable"]:
        _line("database", f"unreachable ({database.get('error')})", "red")
        return
    _line("database", database["url"], "green")
    schema = ", ".join(database["revision"]) or "empty"
    _line("schema", f"{schema} (current)" if database["current"]
          else f"{schema} (run `gateway db upgrade`)", "green" if database["current"] else "red")
    keys = report.get("keys", {})
    if "error" in keys:
        _line("keys", keys["error"], "red")
    else:
        use = ", ".join(f"{v}: {n}" for v, n in sorted(keys.get("in_use", {}).items()))
        stale = [v for v in keys.get("in_use", {}) if v != f"v{keys['current']}"]
        _line("keys", f"current v{keys['current']}; secrets by version: {use or 'none'}",
              "yellow" if stale else "green")
    if "instances" in keys:
        wrapping = ", ".join(f"{i['instance']} ({i['role']}) {i['wraps_with']}"
                             for i in keys["instances"])
        behind = [i for i in keys["instances"] if i["wraps_with"] != f"v{keys['current']}"]
        _line("wrapping", wrapping or "no process wrapped a secret lately",
              "yellow" if behind else "green")
    if "webhooks" in report:
        hooks = report["webhooks"]
        _line("webhooks", f"backlog {hooks['backlog']} (oldest due {hooks['oldest_due'] or '-'})"
              f", dead {hooks['dead']}, delivered {hooks['delivered']}",
              "red" if hooks["dead"] else "yellow" if hooks["backlog"] else "green")
        _line("worker", hooks["stalled"] or f"last looked for due webhooks at "
              f"{hooks['worker_last_poll'] or '- (none running)'}",
              "red" if hooks["stalled"] else "green")
        if hooks.get("unsigned_clients"):
            _line("signing", f"{CANNOT_SIGN}; clients {', '.join(hooks['unsigned_clients'])}, "
                  f"{hooks['failing_unsigned']} event(s) failing", "red")
        counts = ", ".join(f"{s} {n}" for s, n in report["elicitations"].items())
        _line("elicitations", counts)
    for type_id, at in sorted(report.get("oauth_client_refused", {}).items()):
        _line("oauth client", f"{type_id}: its provider last refused the gateway's client "
              f"(invalid_client) at {at}; check the type's client_id and secret", "yellow")
    oauth = report["oauth"]
    if "error" in oauth:
        _line("oauth", oauth["error"], "red")
    else:
        if not oauth["types"]:
            _line("oauth", "no OAuth types in the catalog")
        for type_id, uri in oauth["redirect_uris"].items():
            _line("oauth", f"{type_id}: redirect URI {uri} (register it with this type's "
                  "provider alone)")
