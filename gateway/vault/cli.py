"""``gateway keys``: the key-encryption keys: list, rotate, rewrap, retire.

Rotation is three steps, each safe to repeat, none needing a restart (the
versions live in the database, see :mod:`gateway.vault.versions`): ``rotate``
adds a version, which every running process wraps new data keys with within
:data:`~gateway.vault.versions.REFRESH`; ``rewrap`` moves every stored data key
to it (in batches, each its own transaction, so an interrupted run simply
continues where it stopped); ``retire`` deletes the old version once nothing
uses it and no running process still wraps with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import click
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway import cli
from gateway.audit import service as audit
from gateway.clients.models import WebhookSecret
from gateway.clients.service import webhook_secret_binding
from gateway.clock import SystemClock
from gateway.credentials.models import Credential
from gateway.credentials.service import binding as credential_binding
from gateway.vault import versions
from gateway.vault.envelope import VaultError
from gateway.vault.envelope import rewrap as rewrap_envelope
from gateway.vault.keyring import KEYRING_FILE, Keyring

BATCH: Final = 500
# Every table holding sealed secrets, with the binding of a row's ciphertext.
SEALED: Final[list[tuple[Any, Callable[[Any], bytes]]]] = [
    (Credential, credential_binding),
    (WebhookSecret, webhook_secret_binding),
]
# What an operator calls a row of each, in a message.
SEALED_NAMES: Final = {Credential: "credential", WebhookSecret: "webhook secret"}


def _usage(session: Session) -> dict[int, int]:
    counts: dict[int, int] = {}
    for model, _ in SEALED:
        for version, count in session.execute(
                select(model.key_version, func.count()).group_by(model.key_version)):
            counts[version] = counts.get(version, 0) + count
    return counts


@click.group(cls=cli.Group)
def keys() -> None:
    """Key-encryption keys of the vault."""


@keys.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def list_keys(as_json: bool) -> None:
    """Key versions, which one is current, and how many secrets each wraps."""
    root = cli.key_versions().root
    with cli.transaction() as session:
        usage = _usage(session)
        stored = {v: f"database (root v{row.root_version})"
                  for v, row in versions.stored(session).items() if row.carried_over}
        instances = versions.fresh_heartbeats(session, SystemClock().now())
    known = stored or dict.fromkeys(root.keys, "keyring")
    current = max(known)
    rows = [{"version": f"v{version}", "current": version == current,
             "secrets": usage.get(version, 0), "stored": known[version]}
            for version in sorted(known, reverse=True)]
    missing = sorted(set(usage) - set(known))
    wrapping = [{"instance": i.instance, "role": i.role, "wraps_with": f"v{i.key_version}"}
                for i in instances]
    if as_json:
        cli.echo_json({"source": _source(), "root": f"v{root.current_version}",
                       "versions": rows, "missing_versions": [f"v{v}" for v in missing],
                       "instances": wrapping})
        return
    click.echo(f"root key: v{root.current_version} of {_source()}")
    cli.echo_table([{**r, "current": "yes" if r["current"] else ""} for r in rows],
                   ["version", "current", "secrets", "stored"])
    for version in missing:
        click.secho(f"v{version} wraps {usage[version]} secret(s) but is not a key version!",
                    fg="red")
    for instance in wrapping:
        click.echo(f"{instance['instance']} ({instance['role']}) wraps new secrets with "
                   f"{instance['wraps_with']}")


@keys.command()
def rotate() -> None:
    """Add a key version; every running instance wraps new secrets with it, no restart."""
    root = cli.key_versions().root
    with cli.transaction() as session:
        now = SystemClock().now()
        versions.forget_old_heartbeats(session, now)
        version = versions.add_version(session, root, now)
        _audit(session, "keys.rotated", version)
    seconds = int(versions.REFRESH.total_seconds())
    click.echo(f"added v{version}; every running instance wraps new secrets with it within "
               f"{seconds} s. Next: gateway keys rewrap")


@keys.command()
@click.option("--max", "limit", type=click.IntRange(1), default=None,
              help="Stop after this many secrets (spread the work over several runs).")
def rewrap(limit: int | None) -> None:
    """Move every stored data key to the newest version (resumable)."""
    store = cli.key_versions()
    with cli.transaction() as session:
        resealed = versions.reseal_with_newest_root(session, store.root)
    if resealed:
        click.echo(f"{len(resealed)} key version(s) now sealed by root "
                   f"v{store.root.current_version}")
    current = store.current_version  # and says so, so that no one retires it meanwhile
    keyring = store.snapshot()
    with cli.transaction() as session:
        pending = sum(n for v, n in _usage(session).items() if v != current)
    if limit is not None:
        pending = min(pending, limit)
    moved, unopened = _rewrap_to(keyring, current, limit, pending,
                                 lambda: store.current_version)
    _audit_alone("keys.rewrapped", current, {"secrets": moved, "unopened": unopened})
    click.echo(f"{moved} secret(s) now wrapped by v{current}")
    if unopened:
        cli.fail(f"{unopened} secret(s) did not open and stay under their key version "
                 "(listed above), which cannot be retired while they exist; restore the key "
                 "they need, or revoke and purge them (`gateway credentials purge`)")
    if limit is not None and moved == limit:
        click.echo("stopped at --max; run it again to go on")


def _rewrap_to(keyring: Keyring, current: int, limit: int | None, pending: int,
               newest: Callable[[], int]) -> tuple[int, int]:
    """Rewrap batch by batch to ``current``; how many secrets moved, how many did not open.

    A row that does not open is named on stderr and left as it is; the rest
    are rewrapped all the same.
    """
    moved = unopened = 0
    with click.progressbar(length=pending, label=f"rewrapping to v{current}") as bar:
        for model, binding in SEALED:
            after = ""  # rows in id order, so that one left behind is not read again
            while limit is None or moved < limit:
                if newest() != current:
                    cli.fail(f"a newer key version than v{current} was added meanwhile; "
                             "run `gateway keys rewrap` again")
                size = BATCH if limit is None else min(BATCH, limit - moved)
                with cli.transaction() as session:
                    # Locked (PostgreSQL): a connection's refresh may seal a new
                    # token set into a row meanwhile, and the rewrapped key of the
                    # old one must not be written beside it.
                    rows = session.scalars(select(model).where(model.key_version != current,
                                                               model.id > after)
                                           .order_by(model.id).limit(size)
                                           .with_for_update()).all()
                    done = 0
                    for row in rows:
                        try:
                            row.envelope = rewrap_envelope(keyring, row.envelope, binding(row))
                            done += 1
                        except VaultError as error:
                            unopened += 1
                            click.echo(f"{SEALED_NAMES[model]} {row.id} (v{row.key_version})"
                                       f" does not open: {error}", err=True)
                if not rows:
                    break
                after = rows[-1].id
                moved += done
                bar.update(len(rows))
    return moved, unopened


def key_version(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A key version as an operator may write it, ``v2``, ``V2`` or ``2``: its number.

    Every message names it the one way, ``v2``, as ``gateway keys list`` does.
    """
    text = value.strip()
    digits = text[1:] if text[:1] in ("v", "V") else text
    # ASCII only: str.isdigit also takes "²", which int() refuses.
    if not (digits.isascii() and digits.isdigit()):
        raise click.BadParameter(f"a key version looks like v2 (or 2), not {value!r}",
                                 ctx, param)
    return int(digits)


@keys.command()
@click.argument("version", callback=key_version)
def retire(version: int) -> None:
    """Delete a key version; refused while a secret or a running instance still uses it.

    VERSION as `gateway keys list` shows it (v1), or its number alone (1).
    """
    root = cli.key_versions().root
    number = version
    name = f"v{number}"
    now = SystemClock().now()
    with cli.transaction() as session:
        # Before the first rotation the configured keyring's versions are the
        # key versions: they move to the database, where retiring one is a
        # deletion every process sees (refused, all of it is rolled back).
        stored = versions.carry_over(session, root, now)
        if number not in stored:
            cli.fail(f"{name} is not a key version (`gateway keys list` shows them)")
        current = max(v for v, row in stored.items() if row.carried_over)
        if number == current:
            cli.fail(f"{name} is the current version; rotate first, then rewrap")
        in_use = _usage(session).get(number, 0)
        if in_use:
            cli.fail(f"{in_use} secret(s) still use {name}; run `gateway keys rewrap` first")
        wrapping = [i.instance for i in versions.fresh_heartbeats(session, now)
                    if i.key_version == number]
        if wrapping:
            seconds = int(versions.REFRESH.total_seconds())
            cli.fail(f"{len(wrapping)} running instance(s) still wrap new secrets with {name} "
                     f"({', '.join(wrapping)}); each moves to v{current} within "
                     f"{seconds} s of its next secret: try again in a minute")
        session.delete(stored[number])
        try:
            # The database's word, whatever was counted above: a secret sealed
            # under the version may have been stored since.
            session.flush()
        except IntegrityError:
            cli.fail(f"{name} is still used by a secret stored a moment ago; run "
                     "`gateway keys rewrap`, then retire it again")
        versions.forget_old_heartbeats(session, now)
        _audit(session, "keys.retired", number)
    click.echo(f"{name} retired")
    if number in root.keys and number != root.current_version:
        click.echo(f"{name} is still in the keyring ({_source()}); once no key version is "
                   "sealed by it (`gateway keys list`), remove it from there")


def _source() -> str:
    settings = cli.settings()
    if settings.encryption_keys is not None:
        return "GATEWAY_ENCRYPTION_KEYS"
    return str(settings.instance_path / KEYRING_FILE)


def _audit(session: Session, action: str, version: int,
           details: dict[str, Any] | None = None) -> None:
    audit.record(session, SystemClock(), actor=cli.operator(), action=action,
                 target=f"v{version}", details=details or {})


def _audit_alone(action: str, version: int, details: dict[str, Any] | None = None) -> None:
    with cli.transaction() as session:
        _audit(session, action, version, details)
