"""``gateway keys``: the key-encryption keys: list, rotate, rewrap, retire.

Rotation is three steps, each safe to repeat: ``rotate`` adds a version
that wraps all new data keys from then on; ``rewrap`` moves every stored
data key to it (in batches, each its own transaction, so an interrupted run
simply continues where it stopped); ``retire`` removes the old version once
nothing uses it.
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import click
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway import cli
from gateway.audit import service as audit
from gateway.clients.models import WebhookSecret
from gateway.clients.service import webhook_secret_binding
from gateway.clock import SystemClock
from gateway.credentials.models import Credential
from gateway.credentials.service import binding as credential_binding
from gateway.files import FileError, check_private
from gateway.vault.envelope import rewrap as rewrap_envelope
from gateway.vault.keyring import KEYRING_FILE, Keyring, KeyringError, load_keyring

BATCH: Final = 500
# Every table holding sealed secrets, with the binding of a row's ciphertext.
SEALED: Final[list[tuple[Any, Callable[[Any], bytes]]]] = [
    (Credential, credential_binding),
    (WebhookSecret, webhook_secret_binding),
]


def _keyring() -> Keyring:
    try:
        return load_keyring(cli.settings())
    except KeyringError as error:
        cli.fail(str(error))


def _usage(session: Session) -> dict[int, int]:
    counts: dict[int, int] = {}
    for model, _ in SEALED:
        for version, count in session.execute(
                select(model.key_version, func.count()).group_by(model.key_version)):
            counts[version] = counts.get(version, 0) + count
    return counts


@click.group()
def keys() -> None:
    """Key-encryption keys of the vault."""


@keys.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def list_keys(as_json: bool) -> None:
    """Key versions, which one is current, and how many secrets each wraps."""
    keyring = _keyring()
    with cli.transaction() as session:
        usage = _usage(session)
    rows = [{"version": f"v{version}", "current": version == keyring.current_version,
             "secrets": usage.get(version, 0)}
            for version in sorted(keyring.keys, reverse=True)]
    missing = sorted(set(usage) - set(keyring.keys))
    if as_json:
        cli.echo_json({"source": _source(), "versions": rows,
                       "missing_versions": [f"v{v}" for v in missing]})
        return
    click.echo(f"keyring: {_source()}")
    cli.echo_table([{**r, "current": "yes" if r["current"] else ""} for r in rows],
                   ["version", "current", "secrets"])
    for version in missing:
        click.secho(f"v{version} wraps {usage[version]} secret(s) but is not in the keyring!",
                    fg="red")


@keys.command()
def rotate() -> None:
    """Add a key version; it wraps every new secret from now on."""
    keyring = _keyring()
    version = keyring.current_version + 1
    entry = f"v{version}:{base64.b64encode(secrets.token_bytes(32)).decode()}"
    settings = cli.settings()
    if settings.encryption_keys is not None:
        # The keyring lives in the environment; the operator must change it.
        current = settings.encryption_keys.reveal()
        click.echo("The keyring comes from GATEWAY_ENCRYPTION_KEYS. Set it to:")
        click.echo(f"  {entry},{current}")
        click.echo("on every instance, then run `gateway keys rewrap`.")
        _audit("keys.rotation_prepared", version)
        return
    path = settings.instance_path / KEYRING_FILE
    _rewrite(path, [entry, *_entries(path)])
    _audit("keys.rotated", version)
    click.echo(f"added v{version}; it wraps new secrets once each instance restarts. "
               "Next: gateway keys rewrap")


@keys.command()
@click.option("--max", "limit", type=click.IntRange(1), default=None,
              help="Stop after this many secrets (spread the work over several runs).")
def rewrap(limit: int | None) -> None:
    """Move every stored data key to the newest version (resumable)."""
    keyring = _keyring()
    current = keyring.current_version
    with cli.transaction() as session:
        pending = sum(n for v, n in _usage(session).items() if v != current)
    if limit is not None:
        pending = min(pending, limit)
    moved = 0
    with click.progressbar(length=pending, label=f"rewrapping to v{current}") as bar:
        for model, binding in SEALED:
            while limit is None or moved < limit:
                size = BATCH if limit is None else min(BATCH, limit - moved)
                with cli.transaction() as session:
                    rows = session.scalars(select(model).where(model.key_version != current)
                                           .order_by(model.id).limit(size)).all()
                    for row in rows:
                        row.envelope = rewrap_envelope(keyring, row.envelope, binding(row))
                if not rows:
                    break
                moved += len(rows)
                bar.update(len(rows))
    _audit("keys.rewrapped", current, {"secrets": moved})
    click.echo(f"{moved} secret(s) now wrapped by v{current}")
    if limit is not None and moved == limit:
        click.echo("stopped at --max; run it again to go on")


@keys.command()
@click.argument("version")
def retire(version: str) -> None:
    """Remove a key version; refused while any secret still uses it."""
    keyring = _keyring()
    number = _version_number(version)
    if number not in keyring.keys:
        cli.fail(f"{version} is not in the keyring")
    if number == keyring.current_version:
        cli.fail(f"{version} is the current version; rotate first, then rewrap")
    with cli.transaction() as session:
        in_use = _usage(session).get(number, 0)
    if in_use:
        cli.fail(f"{in_use} secret(s) still use {version}; run `gateway keys rewrap` first")
    settings = cli.settings()
    if settings.encryption_keys is not None:
        remaining = [e for e in settings.encryption_keys.reveal().split(",")
                     if e.strip() and not e.strip().startswith(f"v{number}:")]
        click.echo("The keyring comes from GATEWAY_ENCRYPTION_KEYS. Set it to:")
        click.echo(f"  {','.join(remaining)}")
    else:
        path = settings.instance_path / KEYRING_FILE
        _rewrite(path, [e for e in _entries(path) if not e.startswith(f"v{number}:")])
    _audit("keys.retired", number)
    click.echo(f"{version} retired")


def _version_number(text: str) -> int:
    digits = text[1:] if text.startswith("v") else text
    if not digits.isdigit():
        cli.fail(f"a version looks like v2, not {text!r}")
    return int(digits)


def _source() -> str:
    settings = cli.settings()
    if settings.encryption_keys is not None:
        return "GATEWAY_ENCRYPTION_KEYS"
    return str(settings.instance_path / KEYRING_FILE)


def _entries(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _rewrite(path: Path, entries: list[str]) -> None:
    """Replace the keyring file in one step, owner-only from the first byte."""
    try:
        check_private(path, "keyring file")
    except FileError as error:
        cli.fail(str(error))
    scratch = path.with_name(f".{path.name}.new")
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write("# Key-encryption keys, newest first. Keep private and backed up.\n")
        handle.write("\n".join(entries) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(scratch, path)


def _audit(action: str, version: int, details: dict[str, Any] | None = None) -> None:
    with cli.transaction() as session:
        audit.record(session, SystemClock(), actor=cli.operator(), action=action,
                     target=f"v{version}", details=details or {})
