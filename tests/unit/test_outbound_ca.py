"""Trusting a private certificate authority for outbound calls (``outbound_ca_bundle``).

A server on loopback presents a certificate that an internal CA of the
tests' own signed. Every kind of client the gateway calls out with (a
requests session, Authlib's OAuth2Session, the webhook pool) refuses it
until the bundle names that CA, and then reaches it, still checking the
host name, while the public authorities stay trusted beside it.
"""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3
from authlib.integrations.requests_client import OAuth2Session

from gateway.outbound import GuardedPool, OutboundPolicy, finish, guard_session, guarded_session
from gateway.payments import stripe_gateway
from gateway.payments.stripe_gateway import StripeUnavailable
from gateway.settings import Settings, SettingsError, load_settings
from tests.private_ca import PrivateAuthority

pytestmark = pytest.mark.backend_independent

STRIPE_NOT_FOUND = json.dumps({"error": {"type": "invalid_request_error",
                                         "message": "No such checkout.session"}}).encode()


class Handler(http.server.BaseHTTPRequestHandler):
    """``ok`` to anything, but Stripe's API, which answers as for an unknown session."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        status, body = (404, STRIPE_NOT_FOUND) if self.path.startswith("/v1/") else (200, b"ok")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass(frozen=True)
class InternalHost:
    """A TLS server on loopback with a certificate from ``authority``, for ``name``."""

    name: str
    port: int
    authority: PrivateAuthority
    paths: list[str]

    @property
    def url(self) -> str:
        return f"https://{self.name}:{self.port}/"


@pytest.fixture
def authority() -> PrivateAuthority:
    return PrivateAuthority()


@pytest.fixture
def internal_host(authority: PrivateAuthority, tmp_path: Path) -> Iterator[InternalHost]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.paths = []  # type: ignore[attr-defined]
    context = authority.server_context("localhost", tmp_path)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield InternalHost("localhost", server.server_address[1], authority,
                       server.paths)  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()
    thread.join()


def settings_for(tmp_path: Path, host: InternalHost, **extra: str) -> Settings:
    # The development allow-list only lets the guard reach loopback; the
    # certificate is verified exactly as for any public host.
    return load_settings({
        "GATEWAY_INSTANCE_PATH": str(tmp_path), "GATEWAY_SECRET_KEY": "s" * 40,
        "GATEWAY_TOKEN_PEPPER": "p" * 40,
        "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": f"{host.name}:{host.port}", **extra})


def trusting(tmp_path: Path, host: InternalHost) -> OutboundPolicy:
    bundle = host.authority.write(tmp_path / "internal-ca.pem")
    return OutboundPolicy.from_settings(
        settings_for(tmp_path, host, GATEWAY_OUTBOUND_CA_BUNDLE=str(bundle)))


def test_without_the_bundle_the_internal_certificate_is_refused(
    internal_host: InternalHost, tmp_path: Path,
) -> None:
    policy = OutboundPolicy.from_settings(settings_for(tmp_path, internal_host))
    with guarded_session(policy) as http, \
            pytest.raises(requests.exceptions.SSLError, match="certificate verify failed"):
        http.get(internal_host.url)


def test_a_requests_session_trusts_the_bundle(internal_host: InternalHost,
                                              tmp_path: Path) -> None:
    with guarded_session(trusting(tmp_path, internal_host)) as http:
        assert http.get(internal_host.url).text == "ok"


def test_an_authlib_session_trusts_the_bundle(internal_host: InternalHost,
                                              tmp_path: Path) -> None:
    session = guard_session(OAuth2Session(client_id="gateway"), trusting(tmp_path, internal_host))
    with session:
        assert session.get(internal_host.url, withhold_token=True).text == "ok"


def test_the_webhook_pool_trusts_the_bundle(internal_host: InternalHost, tmp_path: Path) -> None:
    untrusting = GuardedPool(OutboundPolicy.from_settings(settings_for(tmp_path, internal_host)))
    with pytest.raises(urllib3.exceptions.SSLError, match="certificate verify failed"):
        untrusting.post(internal_host.url, b"{}", {}, 5)
    response = GuardedPool(trusting(tmp_path, internal_host)).post(internal_host.url, b"{}", {},
                                                                    5)
    assert response.status == 200
    finish(response)


def test_stripe_calls_trust_the_bundle(internal_host: InternalHost, tmp_path: Path) -> None:
    # Stripe's library verifies against its own CA bundle; the extra ones still apply.
    bundle = internal_host.authority.write(tmp_path / "internal-ca.pem")
    stripe_settings = {"GATEWAY_STRIPE_SECRET_KEY": "sk_test_internal",
                       "GATEWAY_STRIPE_WEBHOOK_SECRET": "whsec_internal",
                       "GATEWAY_STRIPE_API_BASE": internal_host.url.rstrip("/")}
    untrusting = stripe_gateway.from_settings(settings_for(tmp_path, internal_host,
                                                           **stripe_settings))
    with pytest.raises(StripeUnavailable, match="could not check the payment"):
        untrusting.retrieve_checkout_session("cs_test_1")
    assert internal_host.paths == []
    trusting_stripe = stripe_gateway.from_settings(settings_for(
        tmp_path, internal_host, GATEWAY_OUTBOUND_CA_BUNDLE=str(bundle), **stripe_settings))
    with pytest.raises(StripeUnavailable, match="refused to check the payment"):
        trusting_stripe.retrieve_checkout_session("cs_test_1")
    assert internal_host.paths == ["/v1/checkout/sessions/cs_test_1"]


def test_the_bundle_still_checks_the_host_name(internal_host: InternalHost,
                                               tmp_path: Path) -> None:
    # The CA is trusted; the certificate it signed is for localhost, not 127.0.0.1.
    policy = trusting(tmp_path, internal_host)
    policy = OutboundPolicy(insecure_hosts=frozenset({f"127.0.0.1:{internal_host.port}"}),
                            extra_ca_certificates=policy.extra_ca_certificates)
    with guarded_session(policy) as http, \
            pytest.raises(requests.exceptions.SSLError, match="IP address mismatch"):
        http.get(f"https://127.0.0.1:{internal_host.port}/")


def test_the_bundle_adds_to_the_authorities_already_trusted(
    internal_host: InternalHost, tmp_path: Path,
) -> None:
    # Another CA in the bundle: the server's own CA, given as the caller's
    # bundle (as requests' public one is), is trusted still.
    other = PrivateAuthority("Another Internal CA").write(tmp_path / "other-ca.pem")
    policy = OutboundPolicy.from_settings(
        settings_for(tmp_path, internal_host, GATEWAY_OUTBOUND_CA_BUNDLE=str(other)))
    own = internal_host.authority.write(tmp_path / "own-ca.pem")
    with guarded_session(policy) as http:
        assert http.get(internal_host.url, verify=str(own)).text == "ok"
        with pytest.raises(requests.exceptions.SSLError):
            http.get(internal_host.url)


def test_the_environment_names_no_bundle(internal_host: InternalHost, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # requests' and OpenSSL's variables are ignored like proxies: one setting decides.
    bundle = internal_host.authority.write(tmp_path / "internal-ca.pem")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    policy = OutboundPolicy.from_settings(settings_for(tmp_path, internal_host))
    with guarded_session(policy) as http, pytest.raises(requests.exceptions.SSLError):
        http.get(internal_host.url)


@pytest.mark.parametrize(("content", "words"), [
    (None, "cannot read"),
    (b"", "holds no PEM certificate"),
    (b"not a certificate\n", "holds no PEM certificate"),
    (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
     "holds no PEM certificate"),
    (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "private key"),
], ids=["missing", "empty", "text", "garbled", "private-key"])
def test_a_bad_bundle_stops_the_settings_with_one_line(
    tmp_path: Path, content: bytes | None, words: str,
) -> None:
    bundle = tmp_path / "bundle.pem"
    if content is not None:
        bundle.write_bytes(content)
    with pytest.raises(SettingsError) as refused:
        load_settings({"GATEWAY_INSTANCE_PATH": str(tmp_path), "GATEWAY_SECRET_KEY": "s" * 40,
                       "GATEWAY_TOKEN_PEPPER": "p" * 40,
                       "GATEWAY_OUTBOUND_CA_BUNDLE": str(bundle)})
    message = str(refused.value)
    assert message.startswith("GATEWAY_OUTBOUND_CA_BUNDLE: ")
    assert words in message
    assert "\n" not in message


def test_a_bundle_of_several_authorities_is_accepted(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(b"# our roots\n" + PrivateAuthority("A").pem + PrivateAuthority("B").pem)
    settings = load_settings({"GATEWAY_INSTANCE_PATH": str(tmp_path),
                              "GATEWAY_SECRET_KEY": "s" * 40, "GATEWAY_TOKEN_PEPPER": "p" * 40,
                              "GATEWAY_OUTBOUND_CA_BUNDLE": str(bundle)})
    pem = OutboundPolicy.from_settings(settings).extra_ca_certificates or ""
    assert pem.count("-----BEGIN CERTIFICATE-----") == 2
    context = ssl.create_default_context(cadata=pem)
    assert context.cert_store_stats()["x509_ca"] >= 2
