"""One typed, validated, read-only settings object.

Sources, later wins: the defaults below, a TOML file (``GATEWAY_CONFIG``, else
``<instance>/gateway.toml``), then ``GATEWAY_*`` environment variables. The
set of keys is closed: an unknown key, a value of the wrong type or a missing
secret stops start-up with one line that names the key. There is no default
for any secret; ``gateway init`` writes fresh random ones.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import os
import ssl
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from limits import parse_many
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from gateway.files import FileError, check_private

ENV_PREFIX: Final = "GATEWAY_"
# GATEWAY_CONFIG chooses where settings come from; it is not a setting itself.
CONFIG_ENV: Final = "GATEWAY_CONFIG"
MIN_SECRET_LENGTH: Final = 32


class SettingsError(Exception):
    """A setting is unknown, malformed or missing; the message names it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key


class Secret:
    """A string that never shows itself in a repr, a log line or a traceback."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The plaintext; call only where the value is actually used."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(Secret)


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of the gateway. Build it with :func:`load_settings`."""

    instance_path: Path
    public_url: str
    secret_key: Secret
    token_pepper: Secret
    allowed_hosts: tuple[str, ...] = ()
    database_url: str = ""
    proxy_hops: int = 0
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    ratelimit_storage_url: str = "memory://"
    ratelimit_api: str = "600/minute"
    ratelimit_api_ip: str = "3000/minute"
    ratelimit_login: str = "10 per 15 minutes"
    ratelimit_portal: str = "300/minute"
    encryption_keys: Secret | None = None
    login_backend: str = "local"
    oidc_issuer: str | None = None
    oidc_client_id: str | None = None
    oidc_client_secret: Secret | None = None
    stripe_secret_key: Secret | None = None
    stripe_webhook_secret: Secret | None = None
    stripe_api_base: str | None = None
    outbound_allow_insecure_hosts: tuple[str, ...] = ()
    outbound_ca_bundle: Path | None = None
    log_level: str = "info"
    log_format: str = "text"
    credential_types_file: Path | None = None
    oauth_refresh_margin_seconds: int = 60
    session_idle_minutes: int = 15
    webhook_secret_grace_hours: int = 24
    webhook_concurrency: int = 8
    webhook_send_timeout_seconds: int = 15
    webhook_lease_seconds: int = 60
    metrics_networks: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
    metrics_token: Secret | None = None
    session_max_hours: int = 8

    @property
    def public_host(self) -> str:
        """The host name users reach, without port."""
        return urlsplit(self.public_url).hostname or ""

    @property
    def public_address(self) -> str:
        """The host as the address bar shows it: with its port, unless that is 443."""
        parts = urlsplit(self.public_url)
        host = self.public_host
        if ":" in host:
            host = f"[{host}]"  # an IPv6 address, bracketed as in a URL
        return host if parts.port in (None, 443) else f"{host}:{parts.port}"

    @property
    def trusted_hosts(self) -> tuple[str, ...]:
        """Host names a request may carry; anything else is answered with 400."""
        return (self.public_host, *self.allowed_hosts)

    @property
    def database_is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


# --- parsing -----------------------------------------------------------------
#
# Each field's type decides how its value is read, from TOML (already typed)
# or from the environment (always a string). Nothing is guessed from how a
# string looks: "1" is an integer only where the field is one.

Parser = Callable[[str, Any, bool], Any]


def _text(key: str, value: Any, from_env: bool) -> str:
    if not isinstance(value, str):
        raise SettingsError(key, f"expected a string, got {_kind(value)}")
    return value


def _integer(key: str, value: Any, from_env: bool) -> int:
    if from_env:
        try:
            return int(value, 10)
        except ValueError:
            raise SettingsError(key, f"expected an integer, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(key, f"expected an integer, got {_kind(value)}")
    return value


def _path(key: str, value: Any, from_env: bool) -> Path:
    text = _text(key, value, from_env)
    if not text:
        raise SettingsError(key, "expected a path, got an empty string")
    return Path(text)


def _secret(key: str, value: Any, from_env: bool) -> Secret:
    return Secret(_text(key, value, from_env))


def _host_list(key: str, value: Any, from_env: bool) -> tuple[str, ...]:
    if from_env:
        items = [part.strip() for part in value.split(",")]
        return tuple(item for item in items if item)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SettingsError(key, f"expected a list of strings, got {_kind(value)}")
    return tuple(value)


def _kind(value: Any) -> str:
    return {
        bool: "a boolean", int: "an integer", float: "a number", str: "a string",
        list: "a list", dict: "a table",
    }.get(type(value), type(value).__name__)


_PARSERS: Final[dict[str, Parser]] = {
    "str": _text,
    "str | None": _text,
    "int": _integer,
    "Path": _path,
    "Path | None": _path,
    "Secret": _secret,
    "Secret | None": _secret,
    "tuple[str, ...]": _host_list,
}


def _parser_for(field: dataclasses.Field[Any]) -> Parser:
    return _PARSERS[str(field.type)]


FIELDS: Final = {field.name: field for field in dataclasses.fields(Settings)}
REQUIRED_SECRETS: Final = ("secret_key", "token_pepper")


def env_name(field: str) -> str:
    """The environment variable of a setting: ``proxy_hops`` → ``GATEWAY_PROXY_HOPS``."""
    return ENV_PREFIX + field.upper()


# --- loading -----------------------------------------------------------------


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read, merge and validate every source; raise SettingsError on the first fault."""
    environ = os.environ if environ is None else environ
    from_env = _read_environment(environ)
    instance_path = from_env.get("instance_path", Path("instance"))
    config_path = Path(environ[CONFIG_ENV]) if CONFIG_ENV in environ else (
        instance_path / "gateway.toml"
    )
    from_file = _read_config_file(config_path, required=CONFIG_ENV in environ)
    values: dict[str, Any] = {"instance_path": instance_path, **from_file, **from_env}
    _check_required_secrets(values, config_path, environ)
    return _validate(values)


def _check_required_secrets(values: dict[str, Any], config_path: Path,
                            environ: Mapping[str, str]) -> None:
    """Each required secret is set; if not, the error says where the gateway looked.

    A command run outside the instance folder finds no config file, and "the
    secret is not set" alone would send the operator after the wrong thing.
    """
    for key in REQUIRED_SECRETS:
        secret = values.get(key)
        if secret is None:
            raise SettingsError(env_name(key), _not_found(config_path, environ))
        if len(secret.reveal()) < MIN_SECRET_LENGTH:
            raise SettingsError(env_name(key), f"must be at least {MIN_SECRET_LENGTH} characters")


def _not_found(config_path: Path, environ: Mapping[str, str]) -> str:
    """Why a required secret is missing, naming the config file it was looked for in."""
    if config_path.is_file():
        return (f"not set, neither in {config_path} nor in the environment; "
                "add it to one of them")
    instance_env = env_name("instance_path")
    folder = config_path.parent
    state = "has no gateway.toml" if folder.is_dir() else "does not exist"
    # (A file GATEWAY_CONFIG names but that is missing stopped us earlier.)
    if instance_env in environ:
        looked = (f"{instance_env} is {environ[instance_env]!r}, the folder "
                  f"{folder.resolve()}, which {state}")
    else:
        looked = (f"{instance_env} is not set, so the gateway looked in ./instance, the "
                  f"folder {folder.resolve()}, which {state}")
    where = "there" if instance_env in environ else "here"
    return (f"not set, and there is no config file to read it from: {looked}. Set "
            f"{instance_env} to your instance folder, or run `gateway init` to make one {where}")


def _read_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV:
            continue
        key = name[len(ENV_PREFIX):].lower()
        if key not in FIELDS:
            raise SettingsError(name, "unknown setting (see config/gateway.example.toml)")
        values[key] = _parser_for(FIELDS[key])(name, raw, True)
    return values


def _read_config_file(path: Path, *, required: bool) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if required:
            raise SettingsError(CONFIG_ENV, f"config file {path} does not exist") from None
        return {}
    except OSError as error:
        raise SettingsError(CONFIG_ENV, f"cannot read {path}: {error.strerror}") from None
    try:
        # It holds the secret key and the token pepper: refused as the keyring is.
        check_private(path, "config file")
    except FileError as error:
        raise SettingsError(CONFIG_ENV, str(error)) from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(str(path), f"not valid TOML: {error}") from None
    values: dict[str, Any] = {}
    for key, raw in document.items():
        if key not in FIELDS:
            raise SettingsError(f"{key} in {path}", "unknown setting")
        values[key] = _parser_for(FIELDS[key])(f"{key} in {path}", raw, False)
    return values


def _validate(values: dict[str, Any]) -> Settings:
    values.setdefault("public_url", "https://localhost:8443")
    values["public_url"] = check_public_url(values["public_url"])
    instance_path: Path = values["instance_path"]
    if not values.get("database_url"):
        values["database_url"] = f"sqlite:///{(instance_path / 'gateway.db').resolve()}"
    try:
        make_url(values["database_url"])
    except ArgumentError:
        raise SettingsError(env_name("database_url"),
                            "not a database URL (e.g. postgresql+psycopg://user@host/db)") \
            from None
    _check_choice(values, "login_backend", ("local", "oidc"))
    _check_choice(values, "log_level", ("debug", "info", "warning", "error"))
    _check_choice(values, "log_format", ("text", "json"))
    for network in values.get("metrics_networks", ()):
        try:
            ipaddress.ip_network(network)
        except ValueError:
            raise SettingsError(env_name("metrics_networks"),
                                f"{network!r} is not a network such as 10.0.0.0/8") from None
    if values.get("webhook_secret_grace_hours", 0) < 0:
        raise SettingsError(env_name("webhook_secret_grace_hours"), "must be 0 or more")
    if values.get("proxy_hops", 0) < 0:
        raise SettingsError(env_name("proxy_hops"), "must be 0 or more")
    for key in ("session_idle_minutes", "session_max_hours", "webhook_concurrency",
                "webhook_send_timeout_seconds", "webhook_lease_seconds"):
        if values.get(key, 1) < 1:
            raise SettingsError(env_name(key), "must be 1 or more")
    _check_lease(values)
    _check_refresh_margin(values)
    _check_login_limit(values)
    if values.get("login_backend") == "oidc":
        for key in ("oidc_issuer", "oidc_client_id", "oidc_client_secret"):
            if not values.get(key):
                raise SettingsError(env_name(key), "required when GATEWAY_LOGIN_BACKEND=oidc")
    if bool(values.get("stripe_secret_key")) != bool(values.get("stripe_webhook_secret")):
        raise SettingsError(
            env_name("stripe_webhook_secret"),
            "GATEWAY_STRIPE_SECRET_KEY and GATEWAY_STRIPE_WEBHOOK_SECRET go together",
        )
    if bool(values.get("tls_certfile")) != bool(values.get("tls_keyfile")):
        raise SettingsError(env_name("tls_keyfile"), "set both TLS files or neither")
    if values.get("outbound_ca_bundle") is not None:
        read_ca_bundle(values["outbound_ca_bundle"])
    return Settings(**values)


def _check_login_limit(values: dict[str, Any]) -> None:
    """The login lockout's limit is one rate (the database keeps one window per key)."""
    raw = values.get("ratelimit_login", FIELDS["ratelimit_login"].default)
    try:
        rates = parse_many(raw)
    except ValueError:
        rates = []
    if len(rates) != 1 or rates[0].amount < 1:
        raise SettingsError(env_name("ratelimit_login"),
                            f"{raw!r} is not one limit such as '10 per 15 minutes'")


def read_ca_bundle(path: Path) -> str:
    """The certificates of ``outbound_ca_bundle`` as PEM; a SettingsError if there are none.

    Checked when the settings are read, so a missing or garbled bundle stops
    start-up instead of failing the first call to an internal host.
    """
    key = env_name("outbound_ca_bundle")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SettingsError(key, f"cannot read {path}: {error.strerror}") from None
    if b"PRIVATE KEY-----" in data:
        # Trust needs certificates only; a key here was copied by mistake.
        raise SettingsError(key, f"{path} holds a private key; give certificates only")
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise SettingsError(key, f"{path} holds no PEM certificate (-----BEGIN "
                                 "CERTIFICATE-----)") from None
    pem = "".join(certificate.public_bytes(Encoding.PEM).decode() for certificate in certificates)
    try:
        ssl.create_default_context().load_verify_locations(cadata=pem)
    except ssl.SSLError as error:
        raise SettingsError(key, f"{path}: a certificate TLS cannot use: {error.reason}") \
            from None
    return pem


def _check_lease(values: dict[str, Any]) -> None:
    # A claimed delivery may wait one send for a free thread, then take one
    # send itself: the lease must outlast both with room to spare, or a live
    # worker's deliveries would be taken over and sent twice.
    timeout_key, lease_key = "webhook_send_timeout_seconds", "webhook_lease_seconds"
    timeout = values.get(timeout_key, FIELDS[timeout_key].default)
    lease = values.get(lease_key, FIELDS[lease_key].default)
    if lease <= 3 * timeout:
        raise SettingsError(env_name(lease_key), f"must be more than three times "
                            f"{env_name(timeout_key)} ({timeout}); got {lease}")


MAX_REFRESH_MARGIN_SECONDS: Final = 3600


def _check_refresh_margin(values: dict[str, Any]) -> None:
    # Access tokens commonly live an hour: a margin as long would refresh
    # nearly every token at nearly every reveal.
    margin = values.get("oauth_refresh_margin_seconds", 0)
    if not 0 <= margin <= MAX_REFRESH_MARGIN_SECONDS:
        raise SettingsError(env_name("oauth_refresh_margin_seconds"),
                            f"must be from 0 to {MAX_REFRESH_MARGIN_SECONDS}; got {margin}")


def check_public_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise SettingsError(env_name("public_url"), f"must be an https:// origin, got {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise SettingsError(env_name("public_url"), "must be an origin only, no path or query")
    return f"https://{parts.netloc}"


def _check_choice(values: dict[str, Any], key: str, choices: tuple[str, ...]) -> None:
    value = values.get(key)
    if value is not None and value not in choices:
        raise SettingsError(env_name(key), f"must be one of {', '.join(choices)}; got {value!r}")
