"""The outbound guard: refusals before any connection, real calls only on loopback.

Names other than ``localhost`` never reach DNS: the policy's ``resolve`` seam
answers them, its ``connect`` seam records the checked address a socket was
opened to and hands back a socket to a server on 127.0.0.1, and a fixture
fails any other lookup, so urllib3 is shown never to resolve behind the guard.
"""

from __future__ import annotations

import http.server
import ipaddress
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3
from authlib.integrations.requests_client import OAuth2Session

from gateway.outbound import (
    DEFAULT_TIMEOUT,
    BlockedDestination,
    GuardedHTTPSConnection,
    GuardedPool,
    IPAddress,
    OutboundPolicy,
    attempt_deadline,
    blocked_reason,
    bound_answers,
    finish,
    guard_session,
    guarded_session,
    open_connection,
)
from gateway.serving.tls import make_self_signed
from gateway.settings import SettingsError, load_settings

pytestmark = pytest.mark.backend_independent

PUBLIC = "93.184.215.14"
OTHER_PUBLIC = "2606:4700:4700::1111"
HOOKS = "hooks.example"

BLOCKED_ADDRESSES = [
    pytest.param("0.0.0.0", id="unspecified-v4"),  # noqa: S104 (an address to refuse)
    pytest.param("10.1.2.3", id="private-10"),
    pytest.param("172.16.0.1", id="private-172.16"),
    pytest.param("192.168.1.1", id="private-192.168"),
    pytest.param("127.0.0.1", id="loopback-v4"),
    pytest.param("127.255.255.254", id="loopback-v4-range"),
    pytest.param("169.254.169.254", id="link-local-metadata"),
    pytest.param("100.64.0.1", id="cgnat"),
    pytest.param("224.0.0.1", id="multicast-v4"),
    pytest.param("240.0.0.1", id="reserved-v4"),
    pytest.param("255.255.255.255", id="broadcast"),
    pytest.param("192.0.0.9", id="ietf-protocol-assignments"),
    pytest.param("192.0.2.1", id="documentation-1"),
    pytest.param("198.51.100.1", id="documentation-2"),
    pytest.param("203.0.113.1", id="documentation-3"),
    pytest.param("198.18.0.1", id="benchmarking"),
    pytest.param("192.88.99.1", id="6to4-relay"),
    pytest.param("::", id="unspecified-v6"),
    pytest.param("::1", id="loopback-v6"),
    pytest.param("fe80::1", id="link-local-v6"),
    pytest.param("fc00::1", id="unique-local"),
    pytest.param("fd12:3456::1", id="unique-local-fd"),
    pytest.param("fec0::1", id="site-local"),
    pytest.param("ff02::1", id="multicast-v6"),
    pytest.param("ff0e::1", id="multicast-v6-global-scope"),
    pytest.param("2001:db8::1", id="documentation-v6"),
    pytest.param("3fff::1", id="documentation-v6-new"),
    pytest.param("100::1", id="discard-v6"),
    pytest.param("2001::1", id="teredo"),
    pytest.param("5f00::1", id="reserved-v6"),
    pytest.param("::7f00:1", id="ipv4-compatible"),
    pytest.param("::ffff:127.0.0.1", id="mapped-loopback"),
    pytest.param("::ffff:10.0.0.1", id="mapped-private"),
    pytest.param("::ffff:169.254.169.254", id="mapped-metadata"),
    pytest.param("64:ff9b::a9fe:a9fe", id="nat64-metadata"),
    pytest.param("64:ff9b::7f00:1", id="nat64-loopback"),
    pytest.param("64:ff9b:1::a00:1", id="nat64-local-use"),
    pytest.param("2002:a00:1::1", id="6to4-private"),
    pytest.param("2002:7f00:1::1", id="6to4-loopback"),
]


def in_url(address: str) -> str:
    return f"[{address}]" if ":" in address else address


# --- seams ----------------------------------------------------------------------------------


@dataclass
class FakeResolver:
    """Answers lookups from a table: the n-th lookup of a name gets its n-th answer."""

    answers: dict[str, list[list[str]]]
    lookups: list[str] = field(default_factory=list)

    def __call__(self, host: str, port: int) -> list[str]:
        count = self.lookups.count(host)
        self.lookups.append(host)
        answers = self.answers[host]
        return answers[min(count, len(answers) - 1)]


@dataclass
class FakeConnector:
    """Records every address a socket is opened to; connects to ``route`` instead."""

    route: tuple[str, int] | None = None
    refuse: frozenset[str] = frozenset()
    opened: list[tuple[str, int, float | None]] = field(default_factory=list)
    sockets: list[socket.socket] = field(default_factory=list)

    def __call__(self, address: IPAddress, port: int, timeout: float | None) -> socket.socket:
        self.opened.append((str(address), port, timeout))
        if str(address) in self.refuse:
            raise ConnectionRefusedError(f"{address} refused")
        host, port = self.route or (str(address), port)
        sock = open_connection(ipaddress.ip_address(host), port, timeout)
        self.sockets.append(sock)
        return sock


@pytest.fixture(autouse=True)
def _no_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any name lookup but of localhost: names go through the resolve seam."""
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "localhost":
            raise AssertionError(f"unexpected DNS lookup of {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def connector() -> FakeConnector:
    return FakeConnector()


def policy_with(resolver: FakeResolver | None = None, connector: FakeConnector | None = None,
                insecure: tuple[str, ...] = ()) -> OutboundPolicy:
    return OutboundPolicy(
        insecure_hosts=frozenset(insecure),
        resolve=resolver or FakeResolver({}),
        connect=connector or FakeConnector(),
    )


# --- local servers ------------------------------------------------------------------------


class Handler(http.server.BaseHTTPRequestHandler):
    """``/`` answers ok, ``/redirect`` points at the metadata service."""

    def do_GET(self) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/trickle":  # each byte in time, the whole taking two seconds
            self.send_response(200)
            self.send_header("Content-Length", "20")
            self.end_headers()
            for _ in range(20):
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.1)
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class LocalServer:
    server: http.server.HTTPServer
    cafile: Path | None = None
    server_names: list[str | None] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def paths(self) -> list[str]:
        return self.server.paths  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def start_server() -> Iterator[Callable[[], LocalServer]]:
    """Start HTTP servers on 127.0.0.1, each in its own thread; stop them afterwards."""
    running: list[tuple[http.server.HTTPServer, threading.Thread]] = []

    def start() -> LocalServer:
        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        server.paths = []  # type: ignore[attr-defined]
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
        thread.start()
        running.append((server, thread))
        return LocalServer(server)

    yield start
    for server, thread in running:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def start_tls_server(start_server: Callable[[], LocalServer],
                     tmp_path: Path) -> Callable[..., LocalServer]:
    """Start an HTTPS server on 127.0.0.1 with a self-signed certificate for ``names``."""

    def start(*names: str, addresses: tuple[str, ...] = ()) -> LocalServer:
        cert_pem, key_pem = make_self_signed(names, addresses)
        certfile, keyfile = tmp_path / f"{names[0]}.crt", tmp_path / f"{names[0]}.key"
        certfile.write_bytes(cert_pem)
        keyfile.write_bytes(key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile, keyfile)
        local = start_server()
        local.cafile = certfile

        def record_name(sock: Any, server_name: str | None, context: Any) -> None:
            local.server_names.append(server_name)

        context.sni_callback = record_name
        local.server.socket = context.wrap_socket(local.server.socket, server_side=True)
        return local

    return start


@pytest.fixture
def http_server(start_server: Callable[[], LocalServer]) -> LocalServer:
    return start_server()


# --- which addresses are blocked ------------------------------------------------------------


@pytest.mark.parametrize("address", BLOCKED_ADDRESSES)
def test_literal_address_in_url_is_refused_before_any_connection(
    address: str, connector: FakeConnector,
) -> None:
    resolver = FakeResolver({})
    with guarded_session(policy_with(resolver, connector)) as session, \
            pytest.raises(BlockedDestination, match="refused"):
        session.get(f"https://{in_url(address)}/hook")
    assert resolver.lookups == []
    assert connector.opened == []


@pytest.mark.parametrize("address", BLOCKED_ADDRESSES)
def test_name_resolving_to_a_blocked_address_is_refused_before_any_connection(
    address: str, connector: FakeConnector,
) -> None:
    resolver = FakeResolver({HOOKS: [[address]]})
    with guarded_session(policy_with(resolver, connector)) as session, \
            pytest.raises(BlockedDestination) as refusal:
        session.post(f"https://{HOOKS}/hook", json={})
    assert refusal.value.reason.startswith(f"{ipaddress.ip_address(address)} is ")
    assert connector.opened == []


@pytest.mark.parametrize("answer", [[PUBLIC, "10.0.0.7"], ["10.0.0.7", PUBLIC],
                                    [OTHER_PUBLIC, "::1"]])
def test_name_with_any_blocked_address_is_refused(
    answer: list[str], connector: FakeConnector,
) -> None:
    resolver = FakeResolver({HOOKS: [answer]})
    with guarded_session(policy_with(resolver, connector)) as session, \
            pytest.raises(BlockedDestination):
        session.get(f"https://{HOOKS}/hook")
    assert connector.opened == []


@pytest.mark.parametrize("address", [
    PUBLIC, OTHER_PUBLIC, "8.8.8.8", "::ffff:93.184.215.14", "64:ff9b::5db8:d70e",
    "2002:5db8:d70e::1",
])
def test_public_addresses_pass(address: str) -> None:
    assert blocked_reason(ipaddress.ip_address(address)) is None


def test_reason_names_the_embedded_address() -> None:
    reason = blocked_reason(ipaddress.ip_address("::ffff:127.0.0.1"))
    assert reason == "a form of 127.0.0.1, which is loopback"


def test_refusal_shows_scheme_host_and_port_only() -> None:
    with guarded_session(policy_with()) as session, \
            pytest.raises(BlockedDestination) as refusal:
        session.get("https://robot:hunter2@10.0.0.1:8443/hooks/abc?token=s3cret#frag")
    message = str(refusal.value)
    assert message == (
        "outbound request to https://10.0.0.1:8443 refused: "
        "10.0.0.1 is private or special-purpose"
    )


# --- check_url: the guard's word on a configured URL, without a lookup ----------------------


@pytest.mark.parametrize("address", BLOCKED_ADDRESSES)
def test_a_configured_url_with_a_blocked_address_is_refused_without_a_lookup(
    address: str,
) -> None:
    resolver = FakeResolver({})
    with pytest.raises(BlockedDestination) as refusal:
        policy_with(resolver).check_url(f"https://{in_url(address)}:8443/hooks?t=s3cret")
    assert refusal.value.reason.startswith(f"{ipaddress.ip_address(address)} is ")
    assert "s3cret" not in str(refusal.value)
    assert resolver.lookups == []


@pytest.mark.parametrize(("url", "reason"), [
    ("http://hooks.example/x",
     "plain http only to hosts listed in GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS"),
    ("ftp://hooks.example/x", "only https is allowed"),
    ("https:///x", "the URL names no host"),
    ("https://hooks.example:99999/x", "not a URL"),
])
def test_a_configured_url_the_guard_refuses_by_its_form(url: str, reason: str) -> None:
    resolver = FakeResolver({})
    with pytest.raises(BlockedDestination) as refusal:
        policy_with(resolver).check_url(url)
    assert refusal.value.reason == reason
    assert resolver.lookups == []


@pytest.mark.parametrize("url", [f"https://{HOOKS}/x", f"https://{PUBLIC}/x",
                                 f"https://[{OTHER_PUBLIC}]:8443/x"])
def test_a_configured_url_that_may_pass_is_left_to_the_connection(url: str) -> None:
    resolver = FakeResolver({})
    policy_with(resolver).check_url(url)  # a name is resolved and checked when it is called
    assert resolver.lookups == []


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000/hooks", "https://127.0.0.1:9000/x",
                                 "http://localhost:9000/"])
def test_a_configured_url_to_a_listed_host_passes(url: str) -> None:
    policy_with(insecure=("127.0.0.1:9000", "localhost:9000")).check_url(url)
    with pytest.raises(BlockedDestination):
        policy_with(insecure=("127.0.0.1:9001", "localhost:9001")).check_url(url)


# --- DNS rebinding and the checked connection ----------------------------------------------------


def test_connection_goes_to_the_checked_address_with_one_lookup(
    start_tls_server: Callable[..., LocalServer],
) -> None:
    server = start_tls_server(HOOKS)
    resolver = FakeResolver({HOOKS: [[PUBLIC], ["127.0.0.1"]]})  # rebinds after the first lookup
    connector = FakeConnector(route=server.address)
    with guarded_session(policy_with(resolver, connector)) as session:
        response = session.get(f"https://{HOOKS}/", verify=str(server.cafile))
    assert response.status_code == 200
    assert resolver.lookups == [HOOKS]
    assert [address for address, _, _ in connector.opened] == [PUBLIC]
    assert server.server_names == [HOOKS]


def test_each_new_connection_is_resolved_and_checked_again(
    start_tls_server: Callable[..., LocalServer],
) -> None:
    server = start_tls_server(HOOKS)
    resolver = FakeResolver({HOOKS: [[PUBLIC], ["127.0.0.1"]]})
    connector = FakeConnector(route=server.address)
    with guarded_session(policy_with(resolver, connector)) as session:
        assert session.get(f"https://{HOOKS}/", verify=str(server.cafile)).status_code == 200
        # The server spoke HTTP/1.0 and closed, so this request opens a new connection.
        with pytest.raises(BlockedDestination, match=re.escape("127.0.0.1 is loopback")):
            session.get(f"https://{HOOKS}/", verify=str(server.cafile))
    assert resolver.lookups == [HOOKS, HOOKS]
    assert len(connector.opened) == 1


def test_next_checked_address_is_tried_when_the_first_refuses(
    start_tls_server: Callable[..., LocalServer],
) -> None:
    server = start_tls_server(HOOKS)
    resolver = FakeResolver({HOOKS: [[OTHER_PUBLIC, PUBLIC]]})
    connector = FakeConnector(route=server.address, refuse=frozenset({OTHER_PUBLIC}))
    with guarded_session(policy_with(resolver, connector)) as session:
        response = session.get(f"https://{HOOKS}/", verify=str(server.cafile))
    assert response.status_code == 200
    assert [address for address, _, _ in connector.opened] == [OTHER_PUBLIC, PUBLIC]


def test_certificate_is_verified_against_the_host_name(
    start_tls_server: Callable[..., LocalServer],
) -> None:
    server = start_tls_server("other.example")
    resolver = FakeResolver({HOOKS: [[PUBLIC]]})
    connector = FakeConnector(route=server.address)
    mismatch = re.escape(f"not valid for '{HOOKS}'")
    with guarded_session(policy_with(resolver, connector)) as session, \
            pytest.raises(requests.exceptions.SSLError, match=mismatch):
        session.get(f"https://{HOOKS}/", verify=str(server.cafile))
    assert server.server_names == [HOOKS]  # SNI carries the name, not the address


def test_unresolvable_name_is_a_connection_error(connector: FakeConnector) -> None:
    def resolve(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    policy = OutboundPolicy(resolve=resolve, connect=connector)
    with guarded_session(policy) as session, pytest.raises(requests.ConnectionError):
        session.get(f"https://{HOOKS}/")
    assert connector.opened == []


def test_name_without_addresses_is_a_connection_error(connector: FakeConnector) -> None:
    resolver = FakeResolver({HOOKS: [[]]})
    with guarded_session(policy_with(resolver, connector)) as session, \
            pytest.raises(requests.ConnectionError):
        session.get(f"https://{HOOKS}/")
    assert connector.opened == []


def test_connect_timeout_is_reported_as_such() -> None:
    def connect(address: IPAddress, port: int, timeout: float | None) -> socket.socket:
        raise TimeoutError("timed out")

    policy = OutboundPolicy(resolve=FakeResolver({HOOKS: [[PUBLIC]]}), connect=connect)
    with guarded_session(policy) as session, pytest.raises(requests.ConnectTimeout):
        session.get(f"https://{HOOKS}/")


def test_guarded_connection_binds_no_source_address() -> None:
    connection = GuardedHTTPSConnection(HOOKS, 443, policy=policy_with(),
                                        source_address=("127.0.0.1", 0))
    with pytest.raises(ValueError, match="source address"):
        connection.connect()


def test_guarded_connection_will_not_connect_without_verification(
    connector: FakeConnector,
) -> None:
    policy = policy_with(FakeResolver({HOOKS: [[PUBLIC]]}), connector)
    connection = GuardedHTTPSConnection(HOOKS, 443, policy=policy, cert_reqs="CERT_NONE")
    with pytest.raises(BlockedDestination, match="TLS verification cannot be turned off"):
        connection.connect()
    assert connector.opened == []


@pytest.mark.parametrize("setting", [
    {"assert_hostname": False}, {"assert_hostname": "other.example"},
    {"server_hostname": "other.example"}, {"assert_fingerprint": "00" * 32},
    {"ssl_context": ssl.create_default_context()},
])
def test_guarded_connection_checks_the_certificate_against_the_host_name_only(
    setting: dict[str, Any], connector: FakeConnector,
) -> None:
    policy = policy_with(FakeResolver({HOOKS: [[PUBLIC]]}), connector)
    connection = GuardedHTTPSConnection(HOOKS, 443, policy=policy, **setting)
    with pytest.raises(ValueError, match="against the host name only"):
        connection.connect()
    assert connector.opened == []


# --- schemes, development hosts and redirects ----------------------------------------------


@pytest.mark.parametrize("url", ["ftp://hooks.example/x", "file:///etc/passwd",
                                 "gopher://hooks.example/"])
def test_schemes_other_than_http_and_https_are_refused(url: str) -> None:
    with guarded_session(policy_with()) as session, \
            pytest.raises(BlockedDestination, match="only https is allowed"):
        session.get(url)


def test_plain_http_is_refused_by_default(connector: FakeConnector) -> None:
    resolver = FakeResolver({HOOKS: [[PUBLIC]]})
    with guarded_session(policy_with(resolver, connector)) as session, \
            pytest.raises(BlockedDestination, match="plain http only to hosts listed in"):
        session.get(f"http://{HOOKS}/hook")
    assert resolver.lookups == []
    assert connector.opened == []


@pytest.mark.parametrize("listed", [(), ("127.0.0.1:1",), ("localhost:{port}",)])
def test_plain_http_needs_the_exact_host_and_port_listed(
    listed: tuple[str, ...], http_server: LocalServer,
) -> None:
    insecure = tuple(entry.format(port=http_server.port) for entry in listed)
    with guarded_session(OutboundPolicy(insecure_hosts=frozenset(insecure))) as session, \
            pytest.raises(BlockedDestination):
        session.get(f"http://127.0.0.1:{http_server.port}/")
    assert http_server.paths == []


def test_plain_http_to_a_listed_host_works(http_server: LocalServer) -> None:
    policy = OutboundPolicy(insecure_hosts=frozenset({f"127.0.0.1:{http_server.port}"}))
    with guarded_session(policy) as session:
        response = session.get(f"http://127.0.0.1:{http_server.port}/")
    assert (response.status_code, response.text) == (200, "ok")


@pytest.mark.parametrize("allow_redirects", [False, True])
def test_redirect_is_returned_not_followed(
    allow_redirects: bool, http_server: LocalServer,
) -> None:
    policy = OutboundPolicy(insecure_hosts=frozenset({f"127.0.0.1:{http_server.port}"}))
    with guarded_session(policy) as session:
        response = session.get(f"http://127.0.0.1:{http_server.port}/redirect",
                               allow_redirects=allow_redirects)
    assert response.status_code == 302
    assert response.headers["Location"] == "http://169.254.169.254/latest/meta-data/"
    assert response.history == []
    assert response.next is None
    assert http_server.paths == ["/redirect"]


def test_https_to_a_listed_host_on_loopback_verifies_its_certificate(
    start_tls_server: Callable[..., LocalServer],
) -> None:
    server = start_tls_server("localhost")
    policy = OutboundPolicy(insecure_hosts=frozenset({f"localhost:{server.port}"}))
    with guarded_session(policy) as session:
        response = session.get(f"https://localhost:{server.port}/", verify=str(server.cafile))
    assert response.status_code == 200
    assert server.server_names == ["localhost"]


def test_https_to_a_listed_host_refuses_a_certificate_for_another_name(
    start_tls_server: Callable[..., LocalServer],
) -> None:
    server = start_tls_server("other.example", addresses=("127.0.0.1",))
    policy = OutboundPolicy(insecure_hosts=frozenset({f"localhost:{server.port}"}))
    with guarded_session(policy) as session, pytest.raises(requests.exceptions.SSLError):
        session.get(f"https://localhost:{server.port}/", verify=str(server.cafile))


def test_https_to_loopback_is_refused_unless_listed(
    start_tls_server: Callable[..., LocalServer],
) -> None:
    server = start_tls_server("localhost")
    with guarded_session(OutboundPolicy()) as session, \
            pytest.raises(BlockedDestination, match="is loopback"):
        session.get(f"https://localhost:{server.port}/", verify=str(server.cafile))
    assert server.server_names == []


# --- TLS, proxies, timeouts ----------------------------------------------------------------


@pytest.mark.parametrize("verify", [False, ""])
def test_turning_off_tls_verification_is_refused(
    verify: bool | str, connector: FakeConnector,
) -> None:
    resolver = FakeResolver({HOOKS: [[PUBLIC]]})
    with guarded_session(policy_with(resolver, connector)) as session:
        with pytest.raises(BlockedDestination, match="TLS verification cannot be turned off"):
            session.get(f"https://{HOOKS}/", verify=verify)
        session.verify = verify
        with pytest.raises(BlockedDestination, match="TLS verification"):
            session.get(f"https://{HOOKS}/")
    assert connector.opened == []


def test_proxies_from_the_environment_are_ignored(
    monkeypatch: pytest.MonkeyPatch, http_server: LocalServer,
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://proxy.example:3128")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    policy = OutboundPolicy(insecure_hosts=frozenset({f"127.0.0.1:{http_server.port}"}))
    with guarded_session(policy) as session:
        assert session.trust_env is False
        response = session.get(f"http://127.0.0.1:{http_server.port}/")
    assert response.status_code == 200
    assert http_server.paths == ["/"]


def test_explicit_proxies_are_refused(http_server: LocalServer) -> None:
    policy = OutboundPolicy(insecure_hosts=frozenset({f"127.0.0.1:{http_server.port}"}))
    url = f"http://127.0.0.1:{http_server.port}/"
    proxy = {"http": f"http://127.0.0.1:{http_server.port}"}
    with guarded_session(policy) as session:
        with pytest.raises(BlockedDestination, match="proxies are never used"):
            session.get(url, proxies=proxy)
        session.proxies.update(proxy)
        with pytest.raises(BlockedDestination, match="proxies are never used"):
            session.get(url)
    assert http_server.paths == []


def test_timeouts_default_to_five_seconds_to_connect_fifteen_to_read(
    http_server: LocalServer, connector: FakeConnector,
) -> None:
    policy = policy_with(connector=connector, insecure=(f"127.0.0.1:{http_server.port}",))
    with guarded_session(policy) as session:
        session.get(f"http://127.0.0.1:{http_server.port}/")
    assert DEFAULT_TIMEOUT == (5.0, 15.0)
    assert connector.opened == [("127.0.0.1", http_server.port, 5.0)]
    assert connector.sockets[0].gettimeout() == 15.0


def test_a_timeout_the_caller_gives_is_kept(
    http_server: LocalServer, connector: FakeConnector,
) -> None:
    policy = policy_with(connector=connector, insecure=(f"127.0.0.1:{http_server.port}",))
    with guarded_session(policy) as session:
        session.get(f"http://127.0.0.1:{http_server.port}/", timeout=(1.5, 2.5))
    assert connector.opened == [("127.0.0.1", http_server.port, 1.5)]
    assert connector.sockets[0].gettimeout() == 2.5


# --- sessions built elsewhere ----------------------------------------------------------------


def test_adapters_mounted_later_do_not_bypass_the_guard(connector: FakeConnector) -> None:
    with guarded_session(policy_with(connector=connector)) as session:
        session.mount("https://", requests.adapters.HTTPAdapter())
        with pytest.raises(BlockedDestination):
            session.get("https://10.0.0.1/")
    assert connector.opened == []


def test_authlib_oauth2_session_can_be_guarded(connector: FakeConnector) -> None:
    resolver = FakeResolver({"idp.example": [["169.254.169.254"]]})
    session = guard_session(OAuth2Session(client_id="gateway"), policy_with(resolver, connector))
    link_local = re.escape("169.254.169.254 is link-local")
    with session, pytest.raises(BlockedDestination, match=link_local):
        session.get("https://idp.example/.well-known/openid-configuration",
                    withhold_token=True)
    assert session.trust_env is False
    assert connector.opened == []


@pytest.mark.parametrize("allow_redirects", [False, True])
def test_guarded_authlib_session_raises_on_redirect_instead_of_following(
    allow_redirects: bool, http_server: LocalServer,
) -> None:
    policy = OutboundPolicy(insecure_hosts=frozenset({f"127.0.0.1:{http_server.port}"}))
    session = guard_session(OAuth2Session(client_id="gateway"), policy)
    with session, pytest.raises(requests.TooManyRedirects):
        session.get(f"http://127.0.0.1:{http_server.port}/redirect", withhold_token=True,
                    allow_redirects=allow_redirects)
    assert http_server.paths == ["/redirect"]


# --- the policy from settings ----------------------------------------------------------------


def settings_environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "GATEWAY_INSTANCE_PATH": str(tmp_path),
        "GATEWAY_SECRET_KEY": "s" * 40,
        "GATEWAY_TOKEN_PEPPER": "p" * 40,
        **extra,
    }


def test_policy_from_settings_lists_insecure_hosts(tmp_path: Path) -> None:
    settings = load_settings(settings_environ(
        tmp_path,
        GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS="LocalHost:8080, [::1]:9000,127.0.0.1:5000",
    ))
    policy = OutboundPolicy.from_settings(settings)
    assert policy.insecure_hosts == {"localhost:8080", "[::1]:9000", "127.0.0.1:5000"}
    assert policy.timeout == DEFAULT_TIMEOUT


def test_policy_from_default_settings_lists_nothing(tmp_path: Path) -> None:
    policy = OutboundPolicy.from_settings(load_settings(settings_environ(tmp_path)))
    assert policy.insecure_hosts == frozenset()


@pytest.mark.parametrize("entry", ["localhost", "http://localhost:80", "localhost:http",
                                   ":8080", "user@localhost:80", "localhost:80/path",
                                   "localhost:80?x", "[::1:80", "::1:80", "localhost:99999"])
def test_malformed_insecure_host_entry_is_a_settings_error(tmp_path: Path, entry: str) -> None:
    settings = load_settings(settings_environ(
        tmp_path, GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=entry,
    ))
    with pytest.raises(SettingsError, match="GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS"):
        OutboundPolicy.from_settings(settings)


# --- GuardedPool: the same guard without requests -----------------------------------------


def test_pool_posts_through_a_checked_address_and_verifies_the_name(
    start_tls_server: Callable[..., LocalServer],
) -> None:
    server = start_tls_server(HOOKS)
    connector = FakeConnector(route=server.address)
    pool = GuardedPool(policy_with(FakeResolver({HOOKS: [[PUBLIC]]}), connector),
                       ca_certs=str(server.cafile))
    response = pool.post(f"https://{HOOKS}/", b"{}", {"Content-Type": "application/json"}, 5)
    assert response.status == 200
    finish(response)
    assert connector.opened == [(PUBLIC, 443, 5)]
    assert server.server_names == [HOOKS]
    assert server.paths == ["/"]


def test_pool_verifies_certificates_by_default(
    start_tls_server: Callable[..., LocalServer],
) -> None:
    server = start_tls_server(HOOKS)  # self-signed: in no public CA bundle
    connector = FakeConnector(route=server.address)
    pool = GuardedPool(policy_with(FakeResolver({HOOKS: [[PUBLIC]]}), connector))
    with pytest.raises(urllib3.exceptions.SSLError, match="certificate verify failed"):
        pool.post(f"https://{HOOKS}/", b"{}", {}, 5)
    assert server.paths == []


def test_pool_refuses_a_certificate_for_another_name(
    start_tls_server: Callable[..., LocalServer],
) -> None:
    server = start_tls_server("other.example")
    connector = FakeConnector(route=server.address)
    pool = GuardedPool(policy_with(FakeResolver({HOOKS: [[PUBLIC]]}), connector),
                       ca_certs=str(server.cafile))
    with pytest.raises(urllib3.exceptions.SSLError, match=re.escape(f"not valid for '{HOOKS}'")):
        pool.post(f"https://{HOOKS}/", b"{}", {}, 5)


@pytest.mark.parametrize("address", ["10.0.0.5", "127.0.0.1", "169.254.169.254", "::1"])
def test_pool_refuses_a_name_resolving_to_a_blocked_address(
    address: str, connector: FakeConnector,
) -> None:
    pool = GuardedPool(policy_with(FakeResolver({HOOKS: [[PUBLIC, address]]}), connector))
    with pytest.raises(BlockedDestination, match=re.escape(f"{address} is ")):
        pool.post(f"https://{HOOKS}/hooks", b"{}", {}, 5)
    assert connector.opened == []


@pytest.mark.parametrize("url", ["http://hooks.example/", "ftp://hooks.example/",
                                 "file:///etc/passwd"])
def test_pool_refuses_other_schemes_before_anything(url: str, connector: FakeConnector) -> None:
    pool = GuardedPool(policy_with(FakeResolver({HOOKS: [[PUBLIC]]}), connector))
    with pytest.raises(BlockedDestination):
        pool.post(url, b"{}", {}, 5)
    assert connector.opened == []


def test_pool_returns_a_redirect_without_following_it(
    http_server: LocalServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")  # never consulted
    pool = GuardedPool(OutboundPolicy(insecure_hosts=frozenset({f"127.0.0.1:{http_server.port}"})))
    response = pool.post(f"http://127.0.0.1:{http_server.port}/redirect", b"{}", {}, 5)
    assert response.status == 302
    assert response.headers["Location"] == "http://169.254.169.254/latest/meta-data/"
    finish(response)
    assert http_server.paths == ["/redirect"]


# --- a deadline for the whole attempt ---------------------------------------------------------


def test_an_answer_trickled_past_the_attempt_deadline_is_cut_off(
    http_server: LocalServer,
) -> None:
    policy = OutboundPolicy(insecure_hosts=frozenset({f"127.0.0.1:{http_server.port}"}))
    started = time.monotonic()
    with bound_answers(guarded_session(policy), 1024) as session, \
            attempt_deadline(0.5) as deadline, pytest.raises(requests.RequestException):
        # The read timeout never fires: a byte comes every tenth of a second.
        session.get(f"http://127.0.0.1:{http_server.port}/trickle", timeout=(1, 1))
    assert deadline.passed()
    assert time.monotonic() - started < 1.5


def test_an_answer_within_the_attempt_deadline_is_read_whole(http_server: LocalServer) -> None:
    policy = OutboundPolicy(insecure_hosts=frozenset({f"127.0.0.1:{http_server.port}"}))
    with guarded_session(policy) as session, attempt_deadline(5) as deadline:
        answer = session.get(f"http://127.0.0.1:{http_server.port}/trickle", timeout=(1, 1))
    assert (answer.status_code, answer.text) == (200, "x" * 20)
    assert not deadline.passed()
