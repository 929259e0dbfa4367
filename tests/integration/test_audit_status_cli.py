"""``gateway audit`` and ``gateway status``: what operators read, and that it cannot be forged."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask

from tests.conftest import Registered, client_for
from tests.integration.conftest import Result, free_port
from tests.integration.portal.conftest import Browser

pytestmark = pytest.mark.slow

FORGED = "mallory\x1b[31m\n2026-12-02T00:00:00.000Z  operator:root  client.created"


def ok(result: Result) -> str:
    assert result.code == 0, result.stderr
    return result.stdout


def test_audit_lists_records_and_user_text_cannot_forge_lines(
    app: Flask, register: Callable[..., Registered], invoke_gateway: Callable[..., Result],
) -> None:
    register("Weather MCP")
    browser = Browser(client_for(app))
    browser.log_in(FORGED, password="\x1b[31mhunter-password-x")
    table = ok(invoke_gateway("audit"))
    lines = table.strip().splitlines()
    assert len(lines) == 3  # header, client.created, login.failed
    [failed] = [line for line in lines if "login.failed" in line]
    assert "\\n2026-12-02" in failed  # the newline shows as an escape, on the same line
    assert "\x1b" not in table
    records = json.loads(ok(invoke_gateway("audit", "--json")))
    assert sorted(r["action"] for r in records) == ["client.created", "login.failed"]
    [stored] = [r for r in records if r["action"] == "login.failed"]
    assert stored["target"] == FORGED[:64]  # stored as typed (cut at 64), encoded when shown
    assert "hunter" not in json.dumps(records)  # the password is never recorded
    only = json.loads(ok(invoke_gateway("audit", "--json", "--action", "login.")))
    assert [r["action"] for r in only] == ["login.failed"]
    assert json.loads(ok(invoke_gateway("audit", "--json", "--since", "1m")))
    assert json.loads(ok(invoke_gateway("audit", "--json", "--since", "2999-01-01"))) == []
    bad = invoke_gateway("audit", "--since", "yesterday")
    assert bad.code == 1
    assert "--since" in bad.stderr


def test_status_reports_schema_keys_and_backlog(
    register: Callable[..., Registered], invoke_gateway: Callable[..., Result],
) -> None:
    register("Weather MCP")
    report = json.loads(ok(invoke_gateway("status", "--json")))
    assert report["database"]["current"] is True
    assert report["keys"]["current"] == 1
    assert report["keys"]["in_use"] == {"v1": 1}  # the client's webhook secret
    assert report["webhooks"]["backlog"] == 0
    assert report["elicitations"]["pending"] == 0
    assert report["configuration"] == []
    assert report["oauth"] == {"types": [], "redirect_uris": {}}
    text = ok(invoke_gateway("status"))
    assert "schema:" in text
    assert "no OAuth types in the catalog" in text


def test_status_lists_each_oauth_types_own_redirect_uri(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
) -> None:
    catalog = tmp_path / "credential_types.toml"
    catalog.write_text('[generic]\nlabel = "API key"\n' + "".join(
        f'[{name}]\nlabel = "{name}"\nkind = "oauth"\n[{name}.oauth]\n'
        f'authorization_url = "https://{name}.example.com/authorize"\n'
        f'token_url = "https://{name}.example.com/token"\nclient_id = "gateway"\n'
        'token_auth_method = "none"\n' for name in ("github", "linear")))
    environ = {**cli_environ, "GATEWAY_CREDENTIAL_TYPES_FILE": str(catalog)}
    report = json.loads(ok(invoke_gateway("status", "--json", env=environ)))
    assert report["oauth"] == {"types": ["github", "linear"], "redirect_uris": {
        "github": "https://localhost:8443/oauth/callback/github",
        "linear": "https://localhost:8443/oauth/callback/linear"}}
    text = ok(invoke_gateway("status", env=environ))
    assert "github: redirect URI https://localhost:8443/oauth/callback/github" in text
    assert "linear: redirect URI https://localhost:8443/oauth/callback/linear" in text


def test_status_fails_on_a_schema_that_is_not_current(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], empty_database_url: str,
) -> None:
    result = invoke_gateway("status", env={**cli_environ,
                                           "GATEWAY_DATABASE_URL": empty_database_url})
    assert result.code == 1
    assert "gateway db upgrade" in result.stdout


def test_status_fails_when_the_keyring_does_not_open_the_stored_secrets(
    register: Callable[..., Registered], invoke_gateway: Callable[..., Result],
    cli_environ: dict[str, str],
) -> None:
    # A database restored beside another instance's keyring: every count looks
    # right, but no secret opens. Status must say so before a reveal fails.
    register("Weather MCP")
    other = "v1:" + base64.b64encode(b"o" * 32).decode()
    result = invoke_gateway("status", env={**cli_environ, "GATEWAY_ENCRYPTION_KEYS": other})
    assert result.code == 1
    assert "does not open the stored secrets of key version v1" in result.stdout
    report = json.loads(invoke_gateway("status", "--json", env={
        **cli_environ, "GATEWAY_ENCRYPTION_KEYS": other}).stdout)
    assert "wrong keyring" in report["keys"]["error"]


def test_status_names_each_destination_the_outbound_guard_refuses(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
) -> None:
    receiver = f"127.0.0.1:{free_port()}"
    minted = json.loads(ok(invoke_gateway(
        "clients", "create", "Demo MCP server", "--webhook-url", f"http://{receiver}/hooks",
        "--json", env={**cli_environ, "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": receiver})))
    assert json.loads(ok(invoke_gateway("status", "--json", env={
        **cli_environ, "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": receiver})))[
        "configuration"] == []
    catalog = tmp_path / "types.toml"
    catalog.write_text('[generic]\nlabel = "API key"\n[local]\nlabel = "Local key"\n'
                       '[local.check]\nurl = "https://10.0.0.8/check"\nheader = "X-Key"\n')
    environ = {**cli_environ, "GATEWAY_CREDENTIAL_TYPES_FILE": str(catalog),
               "GATEWAY_LOGIN_BACKEND": "oidc", "GATEWAY_OIDC_ISSUER": "http://127.0.0.1:9",
               "GATEWAY_OIDC_CLIENT_ID": "gateway", "GATEWAY_OIDC_CLIENT_SECRET": "s" * 20}

    result = invoke_gateway("status", env=environ)
    assert result.code == 1
    guard = "plain http only to hosts listed in GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS"
    lines = [line for line in result.stdout.splitlines() if line.startswith("config:")]
    assert lines == [
        f"config:       GATEWAY_OIDC_ISSUER: the outbound guard refuses http://127.0.0.1:9 "
        f"({guard}), so nobody can log in; use the identity provider's https issuer",
        f"config:       [local.check] url in {catalog} (GATEWAY_CREDENTIAL_TYPES_FILE): the "
        "outbound guard refuses https://10.0.0.8:443 (10.0.0.8 is private or special-purpose), "
        "so no Local key can be checked, and none stored",
        f"config:       webhook URL of client {minted['client_id']} (Demo MCP server): the "
        f"outbound guard refuses http://{receiver} ({guard}), so every webhook to it fails; "
        f"change it with `gateway clients set-webhook-url {minted['client_id']} URL`",
    ]
    report = json.loads(invoke_gateway("status", "--json", env=environ).stdout)
    assert [(p["setting"], p["refuses_start"]) for p in report["configuration"]] == [
        ("GATEWAY_OIDC_ISSUER", True),
        (f"[local.check] url in {catalog} (GATEWAY_CREDENTIAL_TYPES_FILE)", True),
        (f"webhook URL of client {minted['client_id']} (Demo MCP server)", False)]


def test_status_says_when_the_identity_provider_does_not_answer(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str],
) -> None:
    silent = f"127.0.0.1:{free_port()}"
    environ = {**cli_environ, "GATEWAY_LOGIN_BACKEND": "oidc",
               "GATEWAY_OIDC_ISSUER": f"http://{silent}", "GATEWAY_OIDC_CLIENT_ID": "gateway",
               "GATEWAY_OIDC_CLIENT_SECRET": "s" * 20,
               "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": silent}
    result = invoke_gateway("status", "--json", env=environ)
    assert result.code == 1
    assert json.loads(result.stdout)["configuration"] == [{
        "setting": "GATEWAY_OIDC_ISSUER",
        "problem": f"the identity provider cannot be reached at http://{silent}/.well-known/"
                   "openid-configuration (ConnectionError); logins fail until that is fixed",
        "refuses_start": False}]


def test_status_names_a_malformed_development_host_list(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str],
) -> None:
    result = invoke_gateway("status", "--json", env={
        **cli_environ, "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": "localhost"})
    assert result.code == 1
    assert json.loads(result.stdout)["configuration"] == [{
        "setting": "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS",
        "problem": "expected host:port entries, got 'localhost'", "refuses_start": True}]
