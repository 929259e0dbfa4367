"""The catalog of credential types, read from a TOML file the operator edits.

The file is validated as a whole when the gateway starts: a bad pattern or an
unknown key stops start-up with one line naming the type and the key, rather
than failing later on some user's page.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from flask import current_app

from gateway import resources
from gateway.outbound import DEFAULT_PORTS, OutboundPolicy
from gateway.settings import Secret, Settings

MAX_KEY_LENGTH: Final = 4096
GENERIC: Final = "generic"
EXTENSION: Final = "gateway.catalog"
_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,49}")
_KEYS: Final = {"label", "help", "link", "kind", "pattern", "min_length", "max_length", "check",
                 "hint", "oauth"}
# A connection's hint is its account, never a token's tail: ``hint`` is for keys only.
_API_KEY_ONLY: Final = ("pattern", "min_length", "max_length", "check", "hint")
_OAUTH_KEYS: Final = {"authorization_url", "token_url", "revocation_url", "userinfo_url",
                      "issuer", "scopes", "allow_extra_scopes", "client_id",
                      "client_secret_env", "token_auth_method", "account_field",
                      "extra_authorize_params", "timeout_seconds"}
_AUTH_METHODS: Final = ("client_secret_basic", "client_secret_post", "none")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]{1,200}")  # RFC 6749 section 3.3
# Parameters the gateway sets itself: a catalog may not override them.
_RESERVED_PARAMS: Final = frozenset({"response_type", "client_id", "redirect_uri", "scope",
                                     "state", "nonce", "code_challenge",
                                     "code_challenge_method"})
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
class OAuthProvider:
    """A third-party authorization server, and this gateway's client registration there.

    Either ``issuer`` (OpenID Connect discovery fills in what is missing) or
    both ``authorization_url`` and ``token_url`` are set.
    """

    client_id: str
    client_secret: Secret | None  # None: a public client, PKCE only
    scopes: tuple[str, ...] = ()
    authorization_url: str | None = None
    token_url: str | None = None
    revocation_url: str | None = None
    userinfo_url: str | None = None
    issuer: str | None = None
    allow_extra_scopes: bool = False
    token_auth_method: str = "client_secret_basic"  # noqa: S105 (a method's name)
    # The userinfo (or ID token) claims that name the account, first present wins.
    account_fields: tuple[str, ...] = ("login", "email", "sub")
    extra_authorize_params: tuple[tuple[str, str], ...] = ()
    timeout_seconds: float = 10.0

    @property
    def host(self) -> str:
        """The host the user is sent to, as the connect page shows it."""
        return urlsplit(self.authorization_url or self.issuer or "").netloc


@dataclass(frozen=True, slots=True)
class CredentialType:
    """One kind of key, or of third-party account, a user may be asked for."""

    id: str
    label: str
    help: str = ""
    link: str | None = None
    pattern: re.Pattern[str] | None = None
    min_length: int = 1
    max_length: int = MAX_KEY_LENGTH
    check: LiveCheck | None = None
    # Whether a key's last characters are kept in clear, to recognise it by
    # (its hint, shown on /account, in the API and in webhooks). Off for keys
    # whose tail should be told to nobody: then no hint is stored at all.
    hint: bool = True
    oauth: OAuthProvider | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        """``api_key`` or ``oauth``: what an elicitation of this type asks for."""
        return "oauth" if self.oauth is not None else "api_key"


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

    def ids_of(self, kind: str) -> list[str]:
        """The ids of the types of one kind, ``api_key`` or ``oauth``."""
        return sorted(type_id for type_id, found in self.types.items() if found.kind == kind)


def current_catalog() -> Catalog:
    """The catalog of the current app, read on first use."""
    catalog: Catalog | None = current_app.extensions.get(EXTENSION)
    if catalog is None:
        catalog = catalog_of(current_app.extensions["gateway.settings"])
        current_app.extensions[EXTENSION] = catalog
    return catalog


def catalog_of(settings: Settings, environ: Mapping[str, str] | None = None) -> Catalog:
    """The catalog the settings name, checked against their outbound policy."""
    policy = OutboundPolicy.from_settings(settings)
    return load_catalog(catalog_path(settings), allows_insecure=policy.allows_insecure,
                        environ=os.environ if environ is None else environ)


def catalog_path(settings: Settings) -> Path:
    """The operator's catalog file, or the one shipped with the gateway."""
    return settings.credential_types_file or resources.CONFIG / "credential_types.toml"


# Whether plain http may reach host:port (the development allow-list).
InsecureCheck = Callable[[str, int], bool]


def load_catalog(path: Path, *, allows_insecure: InsecureCheck = lambda host, port: False,
                 environ: Mapping[str, str] | None = None) -> Catalog:
    """Read and validate the catalog file.

    An OAuth type's client secret is read from the environment variable the
    type names (``environ``, the process environment by default); a type
    whose variable is unset is refused, naming the variable.
    """
    context = _Context(allows_insecure, os.environ if environ is None else environ)
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CatalogError(f"cannot read credential types file {path}: {error.strerror}") \
            from None
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(f"{path}: not valid TOML: {error}") from None
    types = {type_id: _parse_type(path, type_id, table, context)
             for type_id, table in document.items()}
    if GENERIC not in types:
        raise CatalogError(f"{path}: the type {GENERIC!r} must be present")
    return Catalog(types)


@dataclass(frozen=True, slots=True)
class _Context:
    allows_insecure: InsecureCheck
    environ: Mapping[str, str]


def _parse_type(path: Path, type_id: str, table: Any, context: _Context) -> CredentialType:
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
    kind = _string(where, table, "kind") or "api_key"
    if kind == "oauth":
        misplaced = [key for key in _API_KEY_ONLY if key in table]
        if misplaced:
            raise CatalogError(f"{where}: {misplaced[0]} is for api_key types, not oauth")
        if "oauth" not in table:
            raise CatalogError(f"{where}: an oauth type needs an [{type_id}.oauth] table")
        return CredentialType(type_id, label or type_id, _string(where, table, "help") or "",
                              link, oauth=_parse_oauth(f"{path}: [{type_id}.oauth]",
                                                       table["oauth"], context))
    if kind != "api_key":
        raise CatalogError(f"{where}: kind is api_key or oauth")
    if "oauth" in table:
        raise CatalogError(f"{where}: an [{type_id}.oauth] table needs kind = \"oauth\"")
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
    check = _parse_check(f"{path}: [{type_id}.check]", table["check"]) if "check" in table else None
    hint = table.get("hint", True)
    if not isinstance(hint, bool):
        raise CatalogError(f"{where}: hint is true or false")
    return CredentialType(type_id, label or type_id, _string(where, table, "help") or "",
                          link, pattern, min_length, max_length, check, hint)


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


def _parse_oauth(where: str, table: Any, context: _Context) -> OAuthProvider:
    if not isinstance(table, dict):
        raise CatalogError(f"{where}: expected a table")
    unknown = sorted(set(table) - _OAUTH_KEYS)
    if unknown:
        raise CatalogError(f"{where}: unknown key {unknown[0]!r}")
    urls = {key: _endpoint(where, table, key, context)
            for key in ("issuer", "authorization_url", "token_url", "revocation_url",
                        "userinfo_url")}
    if urls["issuer"] is None and (urls["authorization_url"] is None or urls["token_url"] is None):
        raise CatalogError(f"{where}: give issuer, or both authorization_url and token_url")
    method = _string(where, table, "token_auth_method") or "client_secret_basic"
    if method not in _AUTH_METHODS:
        raise CatalogError(f"{where}: token_auth_method is one of {', '.join(_AUTH_METHODS)}")
    secret = _client_secret(where, table, context.environ)
    if (secret is None) != (method == "none"):
        raise CatalogError(f"{where}: client_secret_env is required unless token_auth_method "
                           "is none (a public client), and then it must be left out")
    scopes = _scopes(where, table.get("scopes", []))
    extra = table.get("extra_authorize_params", {})
    if not isinstance(extra, dict) or not all(isinstance(v, str) for v in extra.values()):
        raise CatalogError(f"{where}: extra_authorize_params is a table of strings")
    reserved = sorted(set(extra) & _RESERVED_PARAMS)
    if reserved:
        raise CatalogError(f"{where}: extra_authorize_params may not set {reserved[0]!r}; the "
                           "gateway sets it")
    allow_extra = table.get("allow_extra_scopes", False)
    if not isinstance(allow_extra, bool):
        raise CatalogError(f"{where}: allow_extra_scopes is true or false")
    account_field = _string(where, table, "account_field")
    timeout = table.get("timeout_seconds", 10)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or \
            not 0 < timeout <= 30:
        raise CatalogError(f"{where}: timeout_seconds is a number from 0 to 30")
    return OAuthProvider(
        client_id=_string(where, table, "client_id", required=True) or "",
        client_secret=secret, scopes=scopes, allow_extra_scopes=allow_extra,
        token_auth_method=method,
        # The subject names an account when the configured field is not granted.
        account_fields=(account_field, "sub") if account_field else ("login", "email", "sub"),
        extra_authorize_params=tuple(sorted(extra.items())), timeout_seconds=float(timeout),
        **urls)


def _endpoint(where: str, table: dict[str, Any], key: str, context: _Context) -> str | None:
    """A provider URL from the catalog, held to :func:`provider_url_problem`."""
    url = _string(where, table, key)
    if url is None:
        return None
    problem = provider_url_problem(url, context.allows_insecure)
    if problem is not None:
        raise CatalogError(f"{where}: {key} {problem}")
    return url


# RFC 3986's characters without ';': a provider URL reaches a Location header
# and, as its origin, the connect page's Content-Security-Policy, where a ';'
# would start a directive of the provider's choosing. No space, quote, control
# or non-ASCII character either.
_URL_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,=%]+")
_HOST_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_INSECURE_HINT: Final = ("must be an https:// URL (plain http only to a host listed in "
                         "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS, for development)")


def provider_url_problem(url: str, allows_insecure: InsecureCheck) -> str | None:
    """What makes ``url`` unfit as an OAuth provider's endpoint or issuer; None when fit.

    The one rule for every provider URL, from the catalog or from a discovery
    document: https (plain http only to a development host), a strict host
    name or address, an optional port, no user name or password, no fragment,
    and nothing a header or a policy could be split at. The answer completes
    a sentence whose subject names the URL's field.
    """
    if not _URL_CHARACTERS.fullmatch(url):
        return ("holds a character a provider URL may not (such as a space, ';', '\"', a "
                "control or non-ASCII character)")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http"):
        return _INSECURE_HINT
    if "@" in parts.netloc:
        return "may not carry a user name or password"
    try:
        port = parts.port
    except ValueError:
        return "has an invalid port"
    if port == 0:
        return "has an invalid port"
    host = parts.hostname or ""
    if not _valid_host(host):
        return "has no valid host name"
    if parts.netloc.lower() != _netloc(host, port):
        return "has an invalid host or port"
    if parts.scheme == "http" and not allows_insecure(host, port or DEFAULT_PORTS["http"]):
        return _INSECURE_HINT
    if parts.fragment or url.endswith("#"):
        return "may not have a fragment (#...)"
    return None


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of a URL that passed :func:`provider_url_problem`.

    Built from the parsed parts, never cut from the text: this is what a
    Content-Security-Policy source may hold.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port
    if port == DEFAULT_PORTS.get(parts.scheme):
        port = None
    return f"{parts.scheme}://{_netloc(host, port)}"


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        labels = host.split(".")
        return len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)
    return True


def _netloc(host: str, port: int | None) -> str:
    bracketed = f"[{host}]" if ":" in host else host
    return bracketed if port is None else f"{bracketed}:{port}"


def _client_secret(where: str, table: dict[str, Any],
                   environ: Mapping[str, str]) -> Secret | None:
    # The secret itself never lives in the catalog: the file is config, often committed.
    name = _string(where, table, "client_secret_env")
    if name is None:
        return None
    if not _ENV_NAME.fullmatch(name):
        raise CatalogError(f"{where}: client_secret_env is the name of an environment variable")
    value = environ.get(name, "")
    if not value:
        raise CatalogError(f"{where}: the environment variable {name} (client_secret_env) is "
                           "not set; set it to the client secret the provider issued")
    return Secret(value)


def _scopes(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(
            isinstance(scope, str) and _SCOPE.fullmatch(scope) for scope in value):
        raise CatalogError(f"{where}: scopes is a list of scope names (no spaces or quotes)")
    if len(set(value)) != len(value):
        raise CatalogError(f"{where}: scopes lists a scope twice")
    return tuple(value)


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
