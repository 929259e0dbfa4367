"""The configured keyring: key versions, the newest current; and what every key source offers.

The keyring comes from ``GATEWAY_ENCRYPTION_KEYS`` (``v2:<base64>,v1:<base64>``)
or, when that is unset, the instance keyring file written by ``gateway init``
(one ``vN:<base64>`` per line), which must be readable by its owner only.
Its newest version is the root key that seals the key-encryption keys kept
in the database (see :mod:`gateway.vault.versions`); until the first
rotation, its versions are themselves the key-encryption keys.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from flask import current_app

from gateway.files import FileError, check_private
from gateway.settings import Settings

KEY_BYTES: Final = 32
KEYRING_FILE: Final = "keyring"
EXTENSION: Final = "gateway.keyring"
_ENTRY = re.compile(r"v([1-9][0-9]*):(\S+)")


class KeyringError(Exception):
    """The keyring is missing, unsafe or malformed; the message says where."""


class KeySource(Protocol):
    """Key-encryption keys by version: a fixed keyring, or the versions every process shares."""

    @property
    def current_version(self) -> int:
        """The version that wraps new data keys."""

    def key(self, version: int) -> bytes:
        """The key of ``version``; :class:`KeyringError` when there is none."""

    def refresh(self) -> None:
        """Read the versions again now (a version was retired meanwhile)."""


@dataclass(frozen=True, slots=True)
class Keyring:
    """Key-encryption keys by version number."""

    keys: dict[int, bytes] = field(repr=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise KeyringError("the keyring holds no key")

    @property
    def current_version(self) -> int:
        """The version that wraps new data keys: the highest."""
        return max(self.keys)

    def key(self, version: int) -> bytes:
        """The key of ``version``; a missing version is an error, never a fallback."""
        try:
            return self.keys[version]
        except KeyError:
            raise KeyringError(f"key version v{version} is not in the keyring") from None

    def refresh(self) -> None:
        """Nothing to read again: a keyring is fixed."""

    def __repr__(self) -> str:
        versions = ", ".join(f"v{v}" for v in sorted(self.keys, reverse=True))
        return f"Keyring({versions})"


def parse_keyring(entries: list[str], source: str) -> Keyring:
    """Parse ``vN:<base64 of 32 bytes>`` entries; ``source`` names where they came from."""
    keys: dict[int, bytes] = {}
    for entry in entries:
        match = _ENTRY.fullmatch(entry.strip())
        if not match:
            raise KeyringError(f"{source}: entries look like v1:<base64>, got {_masked(entry)}")
        version = int(match[1])
        try:
            key = base64.b64decode(match[2], validate=True)
        except binascii.Error:
            raise KeyringError(f"{source}: v{version} is not valid base64") from None
        if len(key) != KEY_BYTES:
            raise KeyringError(f"{source}: v{version} must be {KEY_BYTES} bytes, not {len(key)}")
        if version in keys:
            raise KeyringError(f"{source}: v{version} appears twice")
        keys[version] = key
    if not keys:
        raise KeyringError(f"{source}: holds no key")
    return Keyring(keys)


def load_keyring(settings: Settings) -> Keyring:
    """The keyring from the environment or the instance keyring file."""
    if settings.encryption_keys is not None:
        entries = settings.encryption_keys.reveal().split(",")
        return parse_keyring([e for e in entries if e.strip()], "GATEWAY_ENCRYPTION_KEYS")
    path = settings.instance_path / KEYRING_FILE
    return read_keyring_file(path)


def current_keyring() -> KeySource:
    """The key versions of the current app (see :func:`gateway.vault.versions.init_app`)."""
    found: KeySource = current_app.extensions[EXTENSION]
    return found


def read_keyring_file(path: Path) -> Keyring:
    """Read a keyring file, refusing one that group or others can read."""
    try:
        check_private(path, "keyring file")
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileError as error:
        raise KeyringError(f"{error}; run `gateway init` or set GATEWAY_ENCRYPTION_KEYS") \
            from None
    except OSError as error:
        raise KeyringError(f"cannot read keyring file {path}: {error.strerror}") from None
    entries = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return parse_keyring(entries, str(path))


def _masked(entry: str) -> str:
    # An entry that fails to parse may still be most of a real key.
    return repr(entry[:3] + "…") if len(entry) > 3 else repr(entry)
