"""Settings: sources and precedence, a closed set of keys, errors that name the key."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gateway import resources
from gateway.settings import FIELDS, Secret, SettingsError, load_settings
from gateway.webhooks.dispatcher import LEASE, SEND_TIMEOUT_SECONDS
from tests.private_ca import PrivateAuthority

SECRETS = {"GATEWAY_SECRET_KEY": "s" * 40, "GATEWAY_TOKEN_PEPPER": "p" * 40}


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    return {"GATEWAY_INSTANCE_PATH": str(tmp_path), **SECRETS}


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    path.chmod(0o600)  # it holds secrets: refused when others can read it
    return path


def error_of(environ: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as caught:
        load_settings(environ)
    message = str(caught.value)
    assert "\n" not in message, "a settings error is one line"
    return message


def test_defaults_need_only_the_secrets(environ: dict[str, str], tmp_path: Path) -> None:
    settings = load_settings(environ)
    assert settings.public_url == "https://localhost:8443"
    assert settings.database_url == f"sqlite:///{(tmp_path / 'gateway.db').resolve()}"
    assert settings.proxy_hops == 0
    assert settings.login_backend == "local"
    assert settings.trusted_hosts == ("localhost",)


def test_config_file_in_the_instance_folder_is_read(environ: dict[str, str],
                                                    tmp_path: Path) -> None:
    write_config(tmp_path, 'public_url = "https://portal.example.com"\nproxy_hops = 2\n')
    settings = load_settings(environ)
    assert settings.public_url == "https://portal.example.com"
    assert settings.proxy_hops == 2


def test_environment_wins_over_file_which_wins_over_defaults(
    environ: dict[str, str], tmp_path: Path
) -> None:
    write_config(tmp_path, 'proxy_hops = 2\nratelimit_api = "5/second"\n')
    settings = load_settings({**environ, "GATEWAY_PROXY_HOPS": "3"})
    assert settings.proxy_hops == 3
    assert settings.ratelimit_api == "5/second"
    assert settings.ratelimit_login == "10 per 15 minutes"


def test_gateway_config_names_the_file(environ: dict[str, str], tmp_path: Path) -> None:
    elsewhere = tmp_path / "etc" / "portal.toml"
    elsewhere.parent.mkdir()
    elsewhere.write_text('allowed_hosts = ["10.0.0.5"]\n')
    elsewhere.chmod(0o600)
    settings = load_settings({**environ, "GATEWAY_CONFIG": str(elsewhere)})
    assert settings.allowed_hosts == ("10.0.0.5",)


def test_gateway_config_that_does_not_exist_stops(environ: dict[str, str],
                                                  tmp_path: Path) -> None:
    message = error_of({**environ, "GATEWAY_CONFIG": str(tmp_path / "missing.toml")})
    assert message.startswith("GATEWAY_CONFIG:")
    assert "does not exist" in message


def test_secrets_come_from_the_file_too(tmp_path: Path) -> None:
    write_config(tmp_path, f'secret_key = "{"k" * 40}"\ntoken_pepper = "{"q" * 40}"\n')
    settings = load_settings({"GATEWAY_INSTANCE_PATH": str(tmp_path)})
    assert settings.secret_key.reveal() == "k" * 40


@pytest.mark.parametrize("missing", ["GATEWAY_SECRET_KEY", "GATEWAY_TOKEN_PEPPER"])
def test_missing_secret_stops_and_is_named(environ: dict[str, str], missing: str) -> None:
    del environ[missing]
    assert error_of(environ).startswith(f"{missing}: not set")


def test_short_secret_is_refused(environ: dict[str, str]) -> None:
    message = error_of({**environ, "GATEWAY_SECRET_KEY": "short"})
    assert message.startswith("GATEWAY_SECRET_KEY: must be at least 32")


def test_unknown_environment_setting_is_named(environ: dict[str, str]) -> None:
    message = error_of({**environ, "GATEWAY_PUBLIC_ULR": "https://typo.example"})
    assert message.startswith("GATEWAY_PUBLIC_ULR: unknown setting")


def test_unknown_file_setting_is_named_with_its_file(environ: dict[str, str],
                                                     tmp_path: Path) -> None:
    path = write_config(tmp_path, "proxy_hopz = 1\n")
    assert error_of(environ) == f"proxy_hopz in {path}: unknown setting"


def test_wrong_type_in_file_is_named(environ: dict[str, str], tmp_path: Path) -> None:
    path = write_config(tmp_path, 'proxy_hops = "two"\n')
    assert error_of(environ) == f"proxy_hops in {path}: expected an integer, got a string"


def test_boolean_is_not_an_integer(environ: dict[str, str], tmp_path: Path) -> None:
    write_config(tmp_path, "proxy_hops = true\n")
    assert "expected an integer, got a boolean" in error_of(environ)


def test_wrong_type_in_environment_is_named(environ: dict[str, str]) -> None:
    message = error_of({**environ, "GATEWAY_PROXY_HOPS": "abc"})
    assert message == "GATEWAY_PROXY_HOPS: expected an integer, got 'abc'"


def test_list_settings_read_commas_from_the_environment(environ: dict[str, str]) -> None:
    settings = load_settings({**environ, "GATEWAY_ALLOWED_HOSTS": "a.example, b.example,"})
    assert settings.allowed_hosts == ("a.example", "b.example")


def test_malformed_toml_names_the_file(environ: dict[str, str], tmp_path: Path) -> None:
    path = write_config(tmp_path, "public_url = [unclosed\n")
    message = error_of(environ)
    assert message.startswith(f"{path}: not valid TOML")


@pytest.mark.parametrize(
    "url",
    ["http://portal.example.com", "https://", "https://portal.example.com/path",
     "https://portal.example.com/?q=1", "https://user@portal.example.com", "portal.example.com"],
)
def test_public_url_must_be_an_https_origin(environ: dict[str, str], url: str) -> None:
    assert error_of({**environ, "GATEWAY_PUBLIC_URL": url}).startswith("GATEWAY_PUBLIC_URL:")


def test_public_url_keeps_its_port_but_loses_a_trailing_slash(environ: dict[str, str]) -> None:
    settings = load_settings({**environ, "GATEWAY_PUBLIC_URL": "https://Portal.example.com:8443/"})
    assert settings.public_url == "https://Portal.example.com:8443"
    assert settings.public_host == "portal.example.com"


@pytest.mark.parametrize(("url", "address"), [
    ("https://portal.example.com", "portal.example.com"),
    ("https://portal.example.com:443", "portal.example.com"),
    ("https://Portal.example.com:8443", "portal.example.com:8443"),
    ("https://[::1]:8443", "[::1]:8443"),
])
def test_the_address_users_see_has_the_port_unless_it_is_443(
        environ: dict[str, str], url: str, address: str) -> None:
    assert load_settings({**environ, "GATEWAY_PUBLIC_URL": url}).public_address == address


def test_oidc_backend_requires_its_provider(environ: dict[str, str]) -> None:
    message = error_of({**environ, "GATEWAY_LOGIN_BACKEND": "oidc",
                        "GATEWAY_OIDC_ISSUER": "https://auth.example.com"})
    assert message.startswith("GATEWAY_OIDC_CLIENT_ID: required")


def test_unknown_login_backend_is_named(environ: dict[str, str]) -> None:
    message = error_of({**environ, "GATEWAY_LOGIN_BACKEND": "ldap"})
    assert message == "GATEWAY_LOGIN_BACKEND: must be one of local, oidc; got 'ldap'"


def test_log_format_is_text_or_json(environ: dict[str, str], tmp_path: Path) -> None:
    assert load_settings(environ).log_format == "text"
    write_config(tmp_path, 'log_format = "json"\n')
    assert load_settings(environ).log_format == "json"
    message = error_of({**environ, "GATEWAY_LOG_FORMAT": "logfmt"})
    assert message == "GATEWAY_LOG_FORMAT: must be one of text, json; got 'logfmt'"


def test_stripe_secrets_go_together(environ: dict[str, str]) -> None:
    message = error_of({**environ, "GATEWAY_STRIPE_SECRET_KEY": "sk_test_123"})
    assert message.startswith("GATEWAY_STRIPE_WEBHOOK_SECRET:")


def test_negative_proxy_hops_is_refused(environ: dict[str, str]) -> None:
    assert error_of({**environ, "GATEWAY_PROXY_HOPS": "-1"}).startswith("GATEWAY_PROXY_HOPS:")


def test_the_webhook_lease_defaults_are_the_dispatchers(environ: dict[str, str]) -> None:
    settings = load_settings(environ)
    assert settings.webhook_send_timeout_seconds == SEND_TIMEOUT_SECONDS
    assert settings.webhook_lease_seconds == LEASE.total_seconds()


def test_a_lease_a_send_could_outlast_is_refused(environ: dict[str, str]) -> None:
    message = error_of({**environ, "GATEWAY_WEBHOOK_SEND_TIMEOUT_SECONDS": "2",
                        "GATEWAY_WEBHOOK_LEASE_SECONDS": "6"})
    assert message == ("GATEWAY_WEBHOOK_LEASE_SECONDS: must be more than three times "
                       "GATEWAY_WEBHOOK_SEND_TIMEOUT_SECONDS (2); got 6")
    short = load_settings({**environ, "GATEWAY_WEBHOOK_SEND_TIMEOUT_SECONDS": "2",
                           "GATEWAY_WEBHOOK_LEASE_SECONDS": "7"})
    assert (short.webhook_send_timeout_seconds, short.webhook_lease_seconds) == (2, 7)


def test_the_refresh_margin_is_a_minute_unless_set(environ: dict[str, str]) -> None:
    assert load_settings(environ).oauth_refresh_margin_seconds == 60
    changed = load_settings({**environ, "GATEWAY_OAUTH_REFRESH_MARGIN_SECONDS": "0"})
    assert changed.oauth_refresh_margin_seconds == 0


@pytest.mark.parametrize("margin", ["-1", "3601"])
def test_a_refresh_margin_out_of_range_is_named(environ: dict[str, str], margin: str) -> None:
    message = error_of({**environ, "GATEWAY_OAUTH_REFRESH_MARGIN_SECONDS": margin})
    assert message.startswith("GATEWAY_OAUTH_REFRESH_MARGIN_SECONDS: must be from 0 to 3600")


def test_settings_are_read_only(environ: dict[str, str]) -> None:
    settings = load_settings(environ)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.proxy_hops = 5  # type: ignore[misc]


def test_secrets_never_show_in_repr(environ: dict[str, str]) -> None:
    settings = load_settings({**environ, "GATEWAY_STRIPE_SECRET_KEY": "sk_test_canary",
                              "GATEWAY_STRIPE_WEBHOOK_SECRET": "whsec_canary"})
    text = repr(settings) + str(settings.secret_key)
    assert "s" * 40 not in text
    assert "p" * 40 not in text
    assert "canary" not in text
    assert "********" in text


def test_secret_compares_in_constant_time_by_value() -> None:
    assert Secret("abc") == Secret("abc")
    assert Secret("abc") != Secret("abd")


def test_example_config_documents_every_setting_and_loads(tmp_path: Path) -> None:
    text = (resources.CONFIG / "gateway.example.toml").read_text()
    documented = set(re.findall(r"^# ([a-z_]+) = ", text, flags=re.MULTILINE))
    assert documented == set(FIELDS)
    # With every setting uncommented (and real-length secrets) it is a valid config.
    uncommented = re.sub(r"^# ([a-z_]+ = )", r"\1", text, flags=re.MULTILINE)
    uncommented = uncommented.replace('"..."', '"' + "z" * 40 + '"')
    # The CA bundle is read as the settings are: the example's path, made real here.
    bundle = PrivateAuthority().write(tmp_path / "internal-ca.pem")
    uncommented = uncommented.replace('"/etc/gateway/internal-ca.pem"', f'"{bundle}"')
    config = write_config(tmp_path, uncommented)
    settings = load_settings({"GATEWAY_CONFIG": str(config)})
    assert settings.public_url == "https://localhost:8443"


@pytest.mark.parametrize("rate", ["often", "10/minute;100/hour", "0 per 15 minutes"])
def test_a_login_limit_that_is_not_one_rate_is_refused(environ: dict[str, str],
                                                       rate: str) -> None:
    assert error_of({**environ, "GATEWAY_RATELIMIT_LOGIN": rate}) == (
        f"GATEWAY_RATELIMIT_LOGIN: {rate!r} is not one limit such as '10 per 15 minutes'")


def test_the_login_limit_defaults_to_ten_per_fifteen_minutes(environ: dict[str, str]) -> None:
    assert load_settings(environ).ratelimit_login == "10 per 15 minutes"
