"""The catalog of credential types, read from a TOML file the operator edits.

The file is validated as a whole when the gateway starts: a bad pattern or an
unknown key stops start-up with one line naming the type and the key, rather
than failing later on some user's page.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from flask import current_app

from gateway import resources
from gateway.settings import Settings

MAX_KEY_LENGTH: Final = 4096
GENERIC: Final = "generic"
EXTENSION: Final = "gateway.catalog"
_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,49}")
_KEYS: Final = {"label", "help", "link", "pattern", "min_length", "max_length", "check"}
_CHECK_KEYS: Final = {"method", "url", "header", "value", "headers", "valid_status",
                      "invalid_status", "timeout_seconds"}
KEY_PLACEHOLDER: Final = "{key}"


class CatalogError(Exception):
    """The catalog file is missing or malformed; the message names the type and key."""


@dataclass(frozen=True, slots=True)
class LiveCheck:
    """How to ask the issuing service whether a key works, before storing it."""

    method: str
    url: str
    header: str  # where the key goes...
    value: str  # ...as this template, with {key} where the key is
    headers: tuple[tuple[str, str], ...] = ()  # fixed extra headers the service wants
    valid_status: frozenset[int] = frozenset({200})
    invalid_status: frozenset[int] = frozenset({401, 403})
    timeout_seconds: float = 5.0


@dataclass(frozen=True, slots=True)
class CredentialType:
    """One kind of key a user may be asked for."""

    id: str
    label: str
    help: str = ""
    link: str | None = None
    pattern: re.Pattern[str] | None = None
    min_length: int = 1
    max_length: int = MAX_KEY_LENGTH
    check: LiveCheck | None = None


@dataclass(frozen=True, slots=True)
class Catalog:
    """Every credential type, by id."""

    types: dict[str, CredentialType]

    def __contains__(self, type_id: object) -> bool:
        return type_id in self.types

    def __iter__(self) -> Iterator[CredentialType]:
        return iter(self.types.values())

    def get(self, type_id: str) -> CredentialType | None:
        return self.types.get(type_id)

    @property
    def ids(self) -> list[str]:
        return sorted(self.types)


def current_catalog() -> Catalog:
    """The catalog of the current app, read on first use."""
    catalog: Catalog | None = current_app.extensions.get(EXTENSION)
    if catalog is None:
        settings: Settings = current_app.extensions["gateway.settings"]
        catalog = load_catalog(catalog_path(settings))
        current_app.extensions[EXTENSION] = catalog
    return catalog


def catalog_path(settings: Settings) -> Path:
    """The operator's catalog file, or the one shipped with the gateway."""
    return settings.credential_types_file or resources.CONFIG / "credential_types.toml"


def load_catalog(path: Path) -> Catalog:
    """Read and validate the catalog file."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CatalogError(f"cannot read credential types file {path}: {error.strerror}") \
            from None
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(f"{path}: not valid TOML: {error}") from None
    types = {type_id: _parse_type(path, type_id, table) for type_id, table in document.items()}
    if GENERIC not in types:
        raise CatalogError(f"{path}: the type {GENERIC!r} must be present")
    return Catalog(types)


def _parse_type(path: Path, type_id: str, table: Any) -> CredentialType:
    where = f"{path}: [{type_id}]"
    if not _ID.fullmatch(type_id):
        raise CatalogError(f"{where}: ids are lower-case letters, digits, '-' and '_'")
    if not isinstance(table, dict):
        raise CatalogError(f"{where}: expected a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise CatalogError(f"{where}: unknown key {unknown[0]!r}")
    label = _string(where, table, "label", required=True)
    link = _string(where, table, "link")
    if link is not None and urlsplit(link).scheme != "https":
        raise CatalogError(f"{where}: link must be an https:// URL")
    pattern_text = _string(where, table, "pattern")
    try:
        pattern = re.compile(pattern_text) if pattern_text is not None else None
    except re.error as error:
        raise CatalogError(f"{where}: pattern is not a valid regular expression: {error}") \
            from None
    min_length = _integer(where, table, "min_length", 1)
    max_length = _integer(where, table, "max_length", MAX_KEY_LENGTH)
    if not 1 <= min_length <= max_length <= MAX_KEY_LENGTH:
        raise CatalogError(f"{where}: need 1 <= min_length <= max_length <= {MAX_KEY_LENGTH}")
    check = _parse_check(f"{where}.check", table["check"]) if "check" in table else None
    return CredentialType(type_id, label or type_id, _string(where, table, "help") or "",
                          link, pattern, min_length, max_length, check)


def _parse_check(where: str, table: Any) -> LiveCheck:
    if not isinstance(table, dict):
        raise CatalogError(f"{where}: expected a table")
    unknown = sorted(set(table) - _CHECK_KEYS)
    if unknown:
        raise CatalogError(f"{where}: unknown key {unknown[0]!r}")
    method = (_string(where, table, "method") or "GET").upper()
    if method not in ("GET", "POST", "HEAD"):
        raise CatalogError(f"{where}: method is GET, POST or HEAD")
    url = _string(where, table, "url", required=True) or ""
    if urlsplit(url).scheme not in ("https", "http") or KEY_PLACEHOLDER in url:
        # The key goes in a header only: URLs end up in logs.
        raise CatalogError(f"{where}: url must be an http(s) URL without {KEY_PLACEHOLDER}")
    header = _string(where, table, "header", required=True) or ""
    value = _string(where, table, "value") or KEY_PLACEHOLDER
    if value.count(KEY_PLACEHOLDER) != 1:
        raise CatalogError(f"{where}: value must hold {KEY_PLACEHOLDER} exactly once")
    extra = table.get("headers", {})
    if not isinstance(extra, dict) or not all(isinstance(v, str) for v in extra.values()):
        raise CatalogError(f"{where}: headers is a table of strings")
    timeout = table.get("timeout_seconds", 5)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or \
            not 0 < timeout <= 30:
        raise CatalogError(f"{where}: timeout_seconds is a number from 0 to 30")
    return LiveCheck(method, url, header, value, tuple(sorted(extra.items())),
                     _statuses(where, table, "valid_status", {200}),
                     _statuses(where, table, "invalid_status", {401, 403}), float(timeout))


def _statuses(where: str, table: dict[str, Any], key: str, default: set[int]) -> frozenset[int]:
    value = table.get(key, sorted(default))
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and 100 <= v <= 599 for v in value):
        raise CatalogError(f"{where}: {key} is a list of HTTP status codes")
    return frozenset(value)


def _string(where: str, table: dict[str, Any], key: str, *, required: bool = False) -> str | None:
    value = table.get(key)
    if value is None:
        if required:
            raise CatalogError(f"{where}: {key} is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise CatalogError(f"{where}: {key} must be a non-empty string")
    return value


def _integer(where: str, table: dict[str, Any], key: str, default: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CatalogError(f"{where}: {key} must be an integer")
    return value
