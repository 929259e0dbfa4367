"""Key-encryption keys kept in the database, so that rotating them needs no restart.

Data keys are wrapped by key-encryption keys (KEKs), by version. The versions
live in the ``key_versions`` table, each KEK sealed with AES-256-GCM by a
root key, with associated data naming the KEK's version and the root's. The
root key is the newest version of the configured keyring
(``GATEWAY_ENCRYPTION_KEYS`` or the instance keyring file). Every process
opens the versions with it, so ``gateway keys rotate``, run anywhere,
reaches every running process on the same database:

- a process that meets an envelope of a version it does not hold reads the
  table again at once; a version it holds costs no database read;
- before it wraps a data key it makes sure it read the table less than
  :data:`REFRESH` ago, and it wraps with the newest version it read. Each
  time it reads before wrapping it records, in ``vault_instances``, which
  version it wraps with and when (its heartbeat);
- every sealed row refers to its version in the table (a foreign key that
  restricts deletion), so the database itself refuses to delete a version a
  stored secret uses, and refuses to store a secret under a version deleted
  meanwhile: a retire and such a store cannot both commit. The store then
  seals the secret again under the current version
  (:func:`gateway.vault.sealing.store_sealed`);
- ``gateway keys retire vN`` also waits until no heartbeat younger than
  :data:`HEARTBEAT_FRESH` names the version, which spares running processes
  that second seal; heartbeats are a courtesy, the foreign key the guarantee.

Deployments from before this table: the configured keyring's versions were
the KEKs, wrapping data keys directly. While no version is carried into the
table they still are, exactly as before; the table then lists, without a
key, each configured version a secret was sealed under (so that the secret
can refer to it). The first ``gateway keys rotate`` carries every
configured version into the table, sealed by the root key, and adds the new
one; from then on the table holds the KEKs and the configured keyring only
root keys. Nothing sealed before is rewritten, and it all still opens.

The root key's own rotation is rare and needs a restart of every process,
since each reads the configured keyring once: add a newer version to the
keyring of every instance, keeping the old one, and restart them all; run
``gateway keys rewrap``, which seals every KEK again with the new root; then
remove the old root from the keyrings. Back up the keyring with the database:
the database's KEKs open only with it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import count
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from flask import Flask
from sqlalchemy import Engine, delete, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from gateway.clock import Clock
from gateway.db import for_reads, unit_of_work
from gateway.settings import Settings
from gateway.vault.keyring import EXTENSION, KEY_BYTES, Keyring, KeyringError, load_keyring
from gateway.vault.models import KeyVersion, VaultInstance

log = logging.getLogger(__name__)

# How old the versions a process wraps with may be: a rotation reaches every
# running process within this time.
REFRESH: Final = timedelta(seconds=30)
# A heartbeat younger than this may name a version its process still wraps with.
HEARTBEAT_FRESH: Final = 2 * REFRESH
# Heartbeats older than this are deleted, by `gateway keys rotate` and `retire`.
HEARTBEAT_FORGOTTEN: Final = timedelta(hours=1)
NONCE_BYTES: Final = 12
# Tells apart the stores of one process in its heartbeats (tests run several apps in one).
_STORES = count(1)


@dataclass(frozen=True, slots=True)
class _Read:
    """The versions as one process last read them."""

    keys: dict[int, bytes] = field(repr=False)
    # When its heartbeat last named the newest of these keys; None until it has.
    announced_at: datetime | None

    @property
    def current(self) -> int:
        return max(self.keys)


class KeyVersions:
    """The key-encryption keys every process shares, read from the database and cached.

    Thread-safe; one per process (an app, a worker, a command).
    """

    def __init__(self, engine: Engine, root: Callable[[], Keyring], clock: Clock, *,
                 role: str) -> None:
        self._engine = engine
        self._root_source = root
        self._root: Keyring | None = None
        self._clock = clock
        self._role = role
        self._lock = threading.Lock()
        self._read: _Read | None = None
        self._number = next(_STORES)

    @property
    def _instance(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}.{self._number}"[:200]

    def __repr__(self) -> str:
        known = "not read yet" if self._read is None else \
            ", ".join(f"v{v}" for v in sorted(self._read.keys, reverse=True))
        return f"KeyVersions({known})"

    @property
    def current_version(self) -> int:
        """The newest version, read less than :data:`REFRESH` ago and announced."""
        read = self._read
        if read is None or read.announced_at is None \
                or self._clock.now() - read.announced_at >= REFRESH:
            read = self._load(announce=True)
        return read.current

    def key(self, version: int) -> bytes:
        """The KEK of ``version``; a version not held yet is looked for in the database."""
        read = self._read
        if read is None or version not in read.keys:
            read = self._load(announce=False)
        try:
            return read.keys[version]
        except KeyError:
            raise KeyringError(f"key version v{version} is not in the keyring") from None

    def refresh(self) -> None:
        """Read the versions now, as a rotation tells the processes it can reach to."""
        self._load(announce=True)

    def withdraw(self) -> None:
        """Delete this process's heartbeat: it wraps nothing more (a command that ends)."""
        try:
            with unit_of_work(self._engine, wait=False) as session:
                session.execute(delete(VaultInstance)
                                .where(VaultInstance.instance == self._instance))
        except SQLAlchemyError as error:
            log.debug("could not withdraw the heartbeat (%s); it goes stale by itself",
                      type(error).__name__)

    def snapshot(self) -> Keyring:
        """The versions as the database holds them now, fixed (for a long run like rewrap)."""
        return Keyring(dict(self._load(announce=False).keys))

    @property
    def root(self) -> Keyring:
        """The configured keyring, read on first use; its newest version is the root key."""
        if self._root is None:
            self._root = self._root_source()
        return self._root

    def _load(self, *, announce: bool) -> _Read:
        with self._lock:
            root = self.root
            with Session(for_reads(self._engine)) as session:
                rows = [row for row in session.scalars(select(KeyVersion)) if row.carried_over]
            # None carried over: nothing rotated since versions moved there,
            # and the configured keyring's versions are the KEKs, as before.
            keys = {row.version: open_version(root, row) for row in rows} if rows \
                else dict(root.keys)
            now = self._clock.now()
            before = self._read
            if announce:
                announced_at = now if self._announce(max(keys), now, listed=bool(rows)) \
                    else None
            elif before is not None and before.current == max(keys):
                announced_at = before.announced_at  # what it announced still holds
            else:
                announced_at = None
            self._read = _Read(keys, announced_at)
            return self._read

    def _announce(self, version: int, now: datetime, *, listed: bool) -> bool:
        """Record the version this process wraps with; False when that could not be done now.

        Unless ``listed``, the version is one of the configured keyring, and
        is listed in the table first if it is not yet: what it seals refers to it.
        """
        instance = self._instance
        try:
            # Never waits: on SQLite this process may itself hold the write
            # lock (a secret sealed inside a transaction). Then that
            # transaction's commit is what a `retire` waits for, and the
            # next wrap reads the versions and tries again.
            with unit_of_work(self._engine, wait=False) as session:
                if not listed and session.get(KeyVersion, version) is None:
                    session.add(KeyVersion(version=version, root_version=None,
                                           wrapped_key=None, created_at=now))
                row = session.get(VaultInstance, instance)
                if row is None:
                    session.add(VaultInstance(instance=instance, role=self._role,
                                              key_version=version, seen_at=now))
                else:
                    row.key_version, row.seen_at = version, now
        except SQLAlchemyError as error:
            log.debug("could not record the key version this process wraps with (%s)",
                      type(error).__name__)
            return False
        return True


def init_app(app: Flask, settings: Settings, engine: Engine, clock: Clock) -> None:
    """Give the app its key versions; nothing is read before the first secret is."""
    app.extensions[EXTENSION] = KeyVersions(engine, lambda: load_keyring(settings), clock,
                                            role="web")


def for_command(settings: Settings, engine: Engine, clock: Clock, *, role: str) -> KeyVersions:
    """Key versions for a command or the worker, the configured keyring read now.

    Reading it now makes a missing or unsafe keyring stop the command with its
    :class:`KeyringError` before any work starts.
    """
    root = load_keyring(settings)
    return KeyVersions(engine, lambda: root, clock, role=role)


# --- the table, for `gateway keys` ---------------------------------------------------------


def stored(session: Session) -> dict[int, KeyVersion]:
    """The versions in the database, by number, also those listed without their key."""
    return {row.version: row for row in session.scalars(select(KeyVersion))}


def carry_over(session: Session, root: Keyring, now: datetime) -> dict[int, KeyVersion]:
    """The stored versions; when none holds its key yet, the configured keyring's, stored first.

    A version listed without its key takes it from the configured keyring
    in place; one the configured keyring no longer has stays listed, keyless.
    """
    rows = stored(session)
    if any(row.carried_over for row in rows.values()):
        return rows
    for version, key in sorted(root.keys.items()):
        sealed = seal_version(root, version, key, now)
        listed = rows.get(version)
        if listed is None:
            rows[version] = sealed
            session.add(sealed)
        else:
            listed.root_version, listed.wrapped_key = sealed.root_version, sealed.wrapped_key
    session.flush()
    return rows


def add_version(session: Session, root: Keyring, now: datetime) -> int:
    """Store a new random KEK one above the newest version; its number."""
    rows = carry_over(session, root, now)
    version = max(rows) + 1
    session.add(seal_version(root, version, AESGCM.generate_key(bit_length=KEY_BYTES * 8),
                             now))
    return version


def reseal_with_newest_root(session: Session, root: Keyring) -> list[int]:
    """Seal every stored KEK with the newest root key, after the root's rotation; which moved."""
    moved: list[int] = []
    for row in stored(session).values():
        if row.carried_over and row.root_version != root.current_version:
            fresh = seal_version(root, row.version, open_version(root, row), row.created_at)
            row.root_version, row.wrapped_key = fresh.root_version, fresh.wrapped_key
            moved.append(row.version)
    return sorted(moved)


def forget_old_heartbeats(session: Session, now: datetime) -> None:
    """Delete the heartbeats of processes long gone (done by commands, not by every process)."""
    session.execute(delete(VaultInstance).where(VaultInstance.seen_at < now - HEARTBEAT_FORGOTTEN))


def fresh_heartbeats(session: Session, now: datetime) -> list[VaultInstance]:
    """The processes that may still wrap data keys with the version they last named."""
    return list(session.scalars(select(VaultInstance)
                                .where(VaultInstance.seen_at > now - HEARTBEAT_FRESH)
                                .order_by(VaultInstance.instance)))


# --- sealing a KEK with the root key ----------------------------------------------------------


def _context(version: int, root_version: int) -> bytes:
    # Binds the sealed KEK to its version: swapped with another row's, it no longer opens.
    return b"gateway key-encryption key v%d|root v%d" % (version, root_version)


def seal_version(root: Keyring, version: int, key: bytes, now: datetime) -> KeyVersion:
    """The KEK of ``version`` sealed by the newest root key, as a row to store."""
    root_version = root.current_version
    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(root.key(root_version)).encrypt(nonce, key,
                                                    _context(version, root_version))
    return KeyVersion(version=version, root_version=root_version, wrapped_key=nonce + sealed,
                      created_at=now)


def open_version(root: Keyring, row: KeyVersion) -> bytes:
    """The KEK a stored version holds; :class:`KeyringError` when the root does not open it."""
    if row.root_version is None or row.wrapped_key is None:
        return root.key(row.version)  # listed only: the configured keyring holds it
    try:
        root_key = root.key(row.root_version)
    except KeyringError:
        raise KeyringError(f"key version v{row.version} is sealed by root key "
                           f"v{row.root_version}, which is not in the keyring") from None
    nonce, sealed = row.wrapped_key[:NONCE_BYTES], row.wrapped_key[NONCE_BYTES:]
    try:
        return AESGCM(root_key).decrypt(nonce, sealed, _context(row.version, row.root_version))
    except (InvalidTag, ValueError):
        raise KeyringError(f"key version v{row.version} does not open with root key "
                           f"v{row.root_version}: wrong keyring for this database?") from None
