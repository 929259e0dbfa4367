"""Start-up checks: the issuer and the catalog's check URLs against the outbound guard, and
whether the identity provider answers, each problem naming the setting to change."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway import preflight
from gateway.outbound import OutboundPolicy
from gateway.preflight import Problem
from gateway.settings import Settings, load_settings

pytestmark = pytest.mark.backend_independent

GUARD_HTTP = "plain http only to hosts listed in GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS"


class Discovery(http.server.BaseHTTPRequestHandler):
    """An identity provider's discovery endpoint answering what the test set."""

    status = 200
    body = b""

    def do_GET(self) -> None:
        if self.status == 0:  # a provider that takes its time
            time.sleep(1)
            return
        origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        body = self.body.replace(b"ISSUER", origin.encode())
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def provider() -> Iterator[Callable[[int, bytes], str]]:
    """Start a discovery endpoint on loopback answering ``status`` and ``body`` (with ISSUER
    standing for its own origin); its issuer."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(status: int, body: bytes) -> str:
        handler = type("Answer", (Discovery,), {"status": status, "body": body})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def settings_for(tmp_path: Path, **extra: str) -> Settings:
    return load_settings({"GATEWAY_INSTANCE_PATH": str(tmp_path),
                          "GATEWAY_SECRET_KEY": "s" * 40, "GATEWAY_TOKEN_PEPPER": "p" * 40,
                          **extra})


def oidc_settings(tmp_path: Path, issuer: str, *, allow: str = "") -> Settings:
    return settings_for(tmp_path, GATEWAY_LOGIN_BACKEND="oidc", GATEWAY_OIDC_ISSUER=issuer,
                        GATEWAY_OIDC_CLIENT_ID="gateway", GATEWAY_OIDC_CLIENT_SECRET="x" * 20,
                        GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=allow)


def issuer_problems(settings: Settings, *, reach: bool = True) -> list[Problem]:
    return preflight.issuer_problems(settings, OutboundPolicy.from_settings(settings),
                                     reach=reach)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# --- the identity provider -----------------------------------------------------------------


def test_the_local_login_needs_no_provider(tmp_path: Path) -> None:
    assert issuer_problems(settings_for(tmp_path)) == []


@pytest.mark.parametrize("reach", [False, True])
def test_an_issuer_the_guard_refuses_refuses_the_start(tmp_path: Path, reach: bool) -> None:
    settings = oidc_settings(tmp_path, "http://127.0.0.1:9000")
    [problem] = issuer_problems(settings, reach=reach)
    assert problem.refuses_start
    assert str(problem) == (
        f"GATEWAY_OIDC_ISSUER: the outbound guard refuses http://127.0.0.1:9000 ({GUARD_HTTP}), "
        "so nobody can log in; use the identity provider's https issuer")


def test_an_issuer_on_a_private_address_is_refused_without_a_call(tmp_path: Path) -> None:
    [problem] = issuer_problems(oidc_settings(tmp_path, "https://10.1.2.3/realms/mcp"))
    assert problem.refuses_start
    assert "refuses https://10.1.2.3:443 (10.1.2.3 is private or special-purpose)" in str(problem)


def test_an_issuer_that_answers_with_its_document_is_fine(
    tmp_path: Path, provider: Callable[[int, bytes], str],
) -> None:
    issuer = provider(200, json.dumps({
        "issuer": "ISSUER", "authorization_endpoint": "ISSUER/auth",
        "token_endpoint": "ISSUER/token", "jwks_uri": "ISSUER/jwks"}).encode())
    settings = oidc_settings(tmp_path, issuer, allow=issuer.removeprefix("http://"))
    assert issuer_problems(settings) == []


def test_an_unreachable_provider_is_a_warning(tmp_path: Path) -> None:
    issuer = f"http://127.0.0.1:{closed_port()}"
    settings = oidc_settings(tmp_path, issuer, allow=issuer.removeprefix("http://"))
    [problem] = issuer_problems(settings)
    assert not problem.refuses_start
    assert str(problem) == (
        f"GATEWAY_OIDC_ISSUER: the identity provider cannot be reached at {issuer}/.well-known/"
        "openid-configuration (ConnectionError); logins fail until that is fixed")
    assert issuer_problems(settings, reach=False) == []


def test_a_slow_provider_is_a_warning(
    tmp_path: Path, provider: Callable[[int, bytes], str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(preflight, "ISSUER_TIMEOUT_SECONDS", 0.2)
    issuer = provider(0, b"")
    settings = oidc_settings(tmp_path, issuer, allow=issuer.removeprefix("http://"))
    [problem] = issuer_problems(settings)
    assert not problem.refuses_start
    assert problem.problem == (f"the identity provider did not answer {issuer}/.well-known/"
                               "openid-configuration within 0.2 s; logins fail until that is "
                               "fixed")


@pytest.mark.parametrize(("status", "body", "said"), [
    (404, b"{}", "answered {url} with HTTP 404"),
    (200, b"<html>", "answered {url} with something other than JSON"),
    (200, b'{"issuer": "https://someone.else"}',
     "discovery document names the issuer 'https://someone.else', not '{issuer}' "
     "(GATEWAY_OIDC_ISSUER)"),
])
def test_a_provider_that_answers_wrongly_is_a_warning(
    tmp_path: Path, provider: Callable[[int, bytes], str], status: int, body: bytes, said: str,
) -> None:
    issuer = provider(status, body)
    settings = oidc_settings(tmp_path, issuer, allow=issuer.removeprefix("http://"))
    [problem] = issuer_problems(settings)
    assert not problem.refuses_start
    url = f"{issuer}/.well-known/openid-configuration"
    assert said.format(url=url, issuer=issuer) in problem.problem
    assert problem.problem.endswith("; logins fail until that is fixed")


# --- the credential types catalog --------------------------------------------------------


CATALOG = """
[generic]
label = "API key"

[weather]
label = "Weather key"

[weather.check]
url = "{url}"
header = "X-Key"
"""


def catalog_problems(settings: Settings) -> list[Problem]:
    return preflight.catalog_problems(settings, OutboundPolicy.from_settings(settings))


def test_the_shipped_catalog_is_fine(tmp_path: Path) -> None:
    assert catalog_problems(settings_for(tmp_path)) == []


@pytest.mark.parametrize(("url", "reason"), [
    ("http://127.0.0.1:8000/check", f"http://127.0.0.1:8000 ({GUARD_HTTP})"),
    ("https://169.254.169.254/latest", "https://169.254.169.254:443 (169.254.169.254 is "
                                       "link-local)"),
])
def test_a_check_url_the_guard_refuses_refuses_the_start(
    tmp_path: Path, url: str, reason: str,
) -> None:
    path = tmp_path / "types.toml"
    path.write_text(CATALOG.format(url=url))
    [problem] = catalog_problems(settings_for(tmp_path, GATEWAY_CREDENTIAL_TYPES_FILE=str(path)))
    assert problem.refuses_start
    assert str(problem) == (
        f"[weather.check] url in {path} (GATEWAY_CREDENTIAL_TYPES_FILE): the outbound guard "
        f"refuses {reason}, so no Weather key can be checked, and none stored")


def test_a_check_url_on_a_listed_development_host_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "types.toml"
    path.write_text(CATALOG.format(url="http://127.0.0.1:8000/check"))
    settings = settings_for(tmp_path, GATEWAY_CREDENTIAL_TYPES_FILE=str(path),
                            GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS="127.0.0.1:8000")
    assert catalog_problems(settings) == []


def test_a_catalog_that_does_not_load_names_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "types.toml"
    path.write_text("[weather]\nlabel = 'Weather key'\n")
    [problem] = catalog_problems(settings_for(tmp_path, GATEWAY_CREDENTIAL_TYPES_FILE=str(path)))
    assert problem.refuses_start
    assert str(problem) == (f"GATEWAY_CREDENTIAL_TYPES_FILE: {path}: the type 'generic' must "
                            "be present")


# --- OAuth types with an issuer --------------------------------------------------------------

OAUTH_CATALOG = """[generic]
label = "API key"

[example]
label = "Example account"
kind = "oauth"

[example.oauth]
issuer = "{issuer}"
client_id = "gateway"
token_auth_method = "none"
"""


def oauth_settings(tmp_path: Path, issuer: str) -> Settings:
    path = tmp_path / "types.toml"
    path.write_text(OAUTH_CATALOG.format(issuer=issuer))
    return settings_for(tmp_path, GATEWAY_CREDENTIAL_TYPES_FILE=str(path),
                        GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=issuer.removeprefix("http://"))


def discovery(**changes: object) -> bytes:
    document = {"issuer": "ISSUER", "authorization_endpoint": "ISSUER/auth",
                "token_endpoint": "ISSUER/token", "code_challenge_methods_supported": ["S256"],
                **changes}
    return json.dumps({key: value for key, value in document.items()
                       if value is not None}).encode()


def test_an_oauth_provider_whose_discovery_is_fit_is_fine(
    tmp_path: Path, provider: Callable[[int, bytes], str],
) -> None:
    assert preflight.oauth_problems(oauth_settings(tmp_path, provider(200, discovery()))) == []


@pytest.mark.parametrize(("changes", "words"), [
    ({"code_challenge_methods_supported": ["plain"]},
     "does not list S256 in code_challenge_methods_supported"),
    ({"code_challenge_methods_supported": None},
     "does not list S256 in code_challenge_methods_supported"),
    ({"authorization_endpoint": "https://idp.example.com;frame-ancestors *;/authorize"},
     "its authorization_endpoint holds a character"),
    ({"jwks_uri": "http://idp.example.com/jwks"}, "its jwks_uri must be an https:// URL"),
    ({"revocation_endpoint": "https://user@idp.example.com/revoke"},
     "its revocation_endpoint may not carry a user name or password"),
])
def test_an_oauth_provider_whose_discovery_is_unfit_refuses_the_start(
    tmp_path: Path, provider: Callable[[int, bytes], str], changes: dict[str, object],
    words: str,
) -> None:
    [problem] = preflight.oauth_problems(oauth_settings(tmp_path,
                                                        provider(200, discovery(**changes))))
    assert problem.refuses_start
    assert problem.setting == "[example.oauth] issuer"
    assert words in problem.problem


def test_a_silent_oauth_provider_is_a_warning(tmp_path: Path) -> None:
    issuer = f"http://127.0.0.1:{closed_port()}"
    [problem] = preflight.oauth_problems(oauth_settings(tmp_path, issuer))
    assert not problem.refuses_start
    assert problem.problem.endswith("; no Example account can be connected until it answers")
