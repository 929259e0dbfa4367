"""The one HTTP client that may call out of the gateway, guarded against SSRF.

API clients choose the URLs the gateway calls (webhooks, live key checks).
Without a guard, anyone able to register a client could make the gateway
fetch from inside its own network: the cloud metadata service on
169.254.169.254, an admin port on 127.0.0.1, a database on 10.0.0.5. Checking
the URL once is not enough: a name can resolve to a public address when it is
checked and to an internal one when the socket connects (DNS rebinding), a
redirect can point anywhere, and a proxy from the environment would connect in
our place. So the rules live in the transport and hold for every connection a
session opens, whoever built the session (``guard_session`` also fits Authlib's
``OAuth2Session``):

- https only;
- the host is resolved once (IPv4 and IPv6) and refused if any address is not
  public (:func:`blocked_reason`);
- the socket connects to an address from that one, checked lookup, while TLS
  still checks the certificate against the host *name* (SNI and hostname
  verification use the name from the URL, never the address);
- redirects are never followed, proxies never used, TLS verification never
  off, and a request without a timeout gets :data:`DEFAULT_TIMEOUT`;
- the certificate authorities trusted are the public ones the caller's
  library ships (requests', Stripe's), plus those of ``outbound_ca_bundle``
  (an internal CA); the environment's (``REQUESTS_CA_BUNDLE``,
  ``SSL_CERT_FILE``) are ignored, like its proxies.

A refusal raises :class:`BlockedDestination`. It is deliberately not a
``requests.RequestException``: a refused destination will not get better on a
retry, so callers handle it apart from transport failures.

For development only, ``outbound_allow_insecure_hosts`` lists ``host:port``
entries the gateway may reach over plain http and on non-public addresses.
An entry lifts the address check for that exact host and port under either
scheme, so a local receiver can be reached over https too, with its
certificate verified as usual.

Testing: the policy carries two seams, ``resolve`` (name to addresses) and
``connect`` (address to socket), so tests refuse names without DNS and see
which address a socket was opened to. The https path is tested end to end on
loopback without loosening any rule: a fake resolver gives a test name a
public address, and a fake connector records that address and hands back a
socket to a local TLS server holding a certificate for the name. The guard
runs unchanged; only the wire is redirected, and a certificate for another
name is shown to be refused. An insecure entry for ``localhost`` is tested
against the same kind of server with the real resolver.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter, HTTPAdapter
from requests.models import PreparedRequest, Response
from requests.utils import DEFAULT_CA_BUNDLE_PATH, select_proxy
from urllib3 import BaseHTTPResponse
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import (
    ConnectTimeoutError,
    DecodeError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)
from urllib3.poolmanager import PoolManager
from urllib3.util import Timeout as Urllib3Timeout
from urllib3.util import (
    create_urllib3_context,
    resolve_cert_reqs,
    resolve_ssl_version,
    ssl_wrap_socket,
)

from gateway.settings import Settings, SettingsError, env_name, read_ca_bundle

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Sequence[str]]
Connector = Callable[[IPAddress, int, float | None], socket.socket]
Timeout = float | tuple[float | None, float | None] | None

DEFAULT_TIMEOUT: Final = (5.0, 15.0)  # (connect, read) seconds
DEFAULT_PORTS: Final = {"http": 80, "https": 443}

_CGNAT: Final = ipaddress.ip_network("100.64.0.0/10")
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
# Special-purpose ranges that Python 3.11's ipaddress still calls global.
_SPECIAL_PURPOSE: Final = tuple(ipaddress.ip_network(network) for network in (
    "192.0.0.0/24",     # IETF protocol assignments
    "192.88.99.0/24",   # 6to4 relay anycast, deprecated
    "3fff::/20",        # documentation (RFC 9637)
    "fec0::/10",        # site-local, deprecated
))


class BlockedDestination(Exception):
    """The guard refused an outbound request; the message says what and why."""

    def __init__(self, destination: str, reason: str) -> None:
        super().__init__(f"outbound request to {destination} refused: {reason}")
        self.destination = destination
        self.reason = reason


# --- which addresses are public ---------------------------------------------------------


def blocked_reason(address: IPAddress) -> str | None:
    """Why the gateway must not connect to ``address``, or None if it is public."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        reason = blocked_reason(embedded)
        return None if reason is None else f"a form of {embedded}, which is {reason}"
    for reason, matches in _RANGES:
        if matches(address):
            return reason
    return None


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, NAT64, 6to4), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


_RANGES: Final[tuple[tuple[str, Callable[[IPAddress], bool]], ...]] = (
    ("unspecified", lambda address: address.is_unspecified),
    ("loopback", lambda address: address.is_loopback),
    ("link-local", lambda address: address.is_link_local),
    ("multicast", lambda address: address.is_multicast),
    ("shared address space (CGNAT)", lambda address: address in _CGNAT),
    ("private or special-purpose", lambda address: address.is_private),
    ("reserved", lambda address: address.is_reserved),
    ("special-purpose", lambda address: any(address in net for net in _SPECIAL_PURPOSE)),
    ("not globally routable", lambda address: not address.is_global),
)


# --- the real resolver and connector -------------------------------------------------------


def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, IPv4 and IPv6, in the resolver's order."""
    results = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in results))


def open_connection(address: IPAddress, port: int, timeout: float | None) -> socket.socket:
    """A TCP socket connected to exactly ``address``, with no name lookup."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((str(address), port))
    except BaseException:
        sock.close()
        raise
    return sock


# --- the policy --------------------------------------------------------------------------


def host_key(host: str, port: int) -> str:
    """``host:port`` as the insecure-host list spells it, IPv6 in brackets."""
    host = host.lower().rstrip(".")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _origin(scheme: str, host: str, port: int) -> str:
    """The part of a URL a refusal may show: never credentials, path or query."""
    return f"{scheme}://{host_key(host, port) if port else host}"


@dataclass(frozen=True, slots=True)
class OutboundPolicy:
    """Where outbound calls may go. Build it with :meth:`from_settings`."""

    insecure_hosts: frozenset[str] = frozenset()
    timeout: tuple[float, float] = DEFAULT_TIMEOUT
    # PEM certificates of further authorities, trusted beside the public ones
    # for every outbound call: an identity provider on an internal CA.
    extra_ca_certificates: str | None = None
    resolve: Resolver = field(default=resolve_host, repr=False, compare=False)
    connect: Connector = field(default=open_connection, repr=False, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> OutboundPolicy:
        """The policy of ``settings``; a malformed insecure-host entry is a SettingsError."""
        bundle = settings.outbound_ca_bundle
        return cls(insecure_hosts=frozenset(
            _parse_host_entry(entry) for entry in settings.outbound_allow_insecure_hosts
        ), extra_ca_certificates=None if bundle is None else read_ca_bundle(bundle))

    def allows_insecure(self, host: str, port: int) -> bool:
        """Whether ``host:port`` is a development host: plain http and any address."""
        return host_key(host, port) in self.insecure_hosts

    def check_scheme(self, scheme: str, host: str, port: int) -> None:
        """Refuse anything but https, and http to a host:port not listed as insecure."""
        if scheme == "https" or (scheme == "http" and self.allows_insecure(host, port)):
            return
        destination = _origin(scheme, host, port)
        if scheme != "http":
            raise BlockedDestination(destination, "only https is allowed")
        listing = env_name("outbound_allow_insecure_hosts")
        raise BlockedDestination(destination, f"plain http only to hosts listed in {listing}")

    def checked_addresses(self, scheme: str, host: str, port: int) -> list[IPAddress]:
        """The addresses to connect to, from one lookup, each one checked."""
        self.check_scheme(scheme, host, port)
        addresses = self._lookup(host, port)
        for address in addresses:
            self._check_address(scheme, host, port, address)
        return addresses

    def check_url(self, url: str) -> None:
        """Refuse ``url`` now if the guard would refuse it whatever the name resolves to.

        The scheme, and the address when the URL names one; no lookup, so it
        suits checks of configured URLs at start-up. A name is resolved and
        its addresses checked when a request connects, as ever.
        """
        try:
            parts = urlsplit(url)
            port = parts.port or DEFAULT_PORTS.get(parts.scheme, 0)
        except ValueError:
            raise BlockedDestination("a malformed URL", "not a URL") from None
        host = parts.hostname
        if not host:
            raise BlockedDestination(f"{parts.scheme}://", "the URL names no host")
        self.check_scheme(parts.scheme, host, port)
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return  # a name: checked at connect time, after the lookup
        self._check_address(parts.scheme, host, port, address)

    def _check_address(self, scheme: str, host: str, port: int, address: IPAddress) -> None:
        if self.allows_insecure(host, port):
            return
        reason = blocked_reason(address)
        if reason is not None:
            raise BlockedDestination(_origin(scheme, host, port), f"{address} is {reason}")

    def _lookup(self, host: str, port: int) -> list[IPAddress]:
        try:
            return [ipaddress.ip_address(host)]
        except ValueError:
            pass  # a name, not a literal address
        addresses = [ipaddress.ip_address(address) for address in self.resolve(host, port)]
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} has no address")
        return addresses


def _parse_host_entry(entry: str) -> str:
    """``Host:port`` from the settings as :func:`host_key` spells it."""
    malformed = SettingsError(
        env_name("outbound_allow_insecure_hosts"), f"expected host:port entries, got {entry!r}",
    )
    try:
        parts = urlsplit("//" + entry.strip())
        host, port = parts.hostname, parts.port
    except ValueError:
        raise malformed from None
    if not host or port is None or parts.username or parts.path or parts.query or parts.fragment:
        raise malformed
    return host_key(host, port)


# --- urllib3: connections that open only checked sockets ------------------------------------


def _open_checked(connection: HTTPConnection, policy: OutboundPolicy, scheme: str) -> socket.socket:
    """A socket to ``connection``'s host via the policy; urllib3's own lookup never runs."""
    if connection.source_address is not None:
        raise ValueError("guarded connections do not bind a source address")
    port = connection.port or DEFAULT_PORTS[scheme]
    try:
        addresses = policy.checked_addresses(scheme, connection.host, port)
        sock = _connect_any(addresses, port, _socket_timeout(connection.timeout), policy.connect)
    except socket.gaierror as error:
        raise NameResolutionError(connection.host, connection, error) from error
    except TimeoutError as error:
        message = f"connecting to {connection.host} timed out after {connection.timeout} s"
        raise ConnectTimeoutError(connection, message) from error
    except OSError as error:
        message = f"Failed to establish a new connection: {error}"
        raise NewConnectionError(connection, message) from error
    for option in connection.socket_options or ():
        sock.setsockopt(*option)
    sys.audit("http.client.connect", connection, connection.host, port)
    return sock


def _connect_any(addresses: Iterable[IPAddress], port: int, timeout: float | None,
                 connect: Connector) -> socket.socket:
    """The first of the checked addresses that accepts, like the system's own fallback."""
    error = OSError("no address to connect to")
    for address in addresses:
        try:
            return connect(address, port, timeout)
        except OSError as failure:
            error = failure
    raise error


def _socket_timeout(value: object) -> float | None:
    """urllib3's timeout as the socket takes it; its "default" marker means the global one."""
    if value is None or isinstance(value, int | float):
        return value
    return socket.getdefaulttimeout()


def _tls_context(connection: HTTPSConnection, policy: OutboundPolicy) -> ssl.SSLContext:
    """The TLS context of a guarded https connection: verification on, by the URL's name.

    It trusts the policy's extra authorities as well as the CA bundle the
    caller names (requests' by default), or else the system's.

    urllib3 has no public way to run its own TLS setup over a socket opened
    elsewhere, so the guarded connection wraps its checked socket itself, with
    this context. Settings that would loosen or move the name check are
    refused before any socket is opened, rather than half honoured.
    """
    if resolve_cert_reqs(connection.cert_reqs) != ssl.CERT_REQUIRED:
        destination = _origin("https", connection.host, connection.port or DEFAULT_PORTS["https"])
        raise BlockedDestination(destination, "TLS verification cannot be turned off")
    if (connection.ssl_context is not None or connection.server_hostname is not None
            or connection.assert_hostname is not None or connection.assert_fingerprint):
        raise ValueError("guarded connections check the certificate against the host name only")
    context = create_urllib3_context(
        ssl_version=resolve_ssl_version(connection.ssl_version),
        ssl_minimum_version=connection.ssl_minimum_version,
        ssl_maximum_version=connection.ssl_maximum_version,
        cert_reqs=ssl.CERT_REQUIRED,
    )
    if not context.check_hostname:  # urllib3 leaves it off under pyOpenSSL and matches itself
        raise RuntimeError("the TLS context does not check host names")
    if not (connection.ca_certs or connection.ca_cert_dir or connection.ca_cert_data):
        context.load_default_certs()
    if policy.extra_ca_certificates:
        # Added to, never instead of, what the connection loads into it.
        context.load_verify_locations(cadata=policy.extra_ca_certificates)
    return context


class GuardedHTTPConnection(HTTPConnection):
    """A plain-http connection that only reaches hosts the policy lists as insecure."""

    def __init__(self, *args: Any, policy: OutboundPolicy, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.policy = policy

    def connect(self) -> None:
        # No proxy and no tunnel ever: the socket is all there is to connect.
        self.sock = _open_checked(self, self.policy, "http")
        DEADLINES.opened(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch_attempt(self)
        super().request(*args, **kwargs)


class GuardedHTTPSConnection(HTTPSConnection):
    """An https connection to a checked address; TLS still verifies the host name."""

    def __init__(self, *args: Any, policy: OutboundPolicy, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.policy = policy

    def connect(self) -> None:
        context = _tls_context(self, self.policy)
        sock = _open_checked(self, self.policy, "https")
        try:
            self.sock = ssl_wrap_socket(
                sock, keyfile=self.key_file, certfile=self.cert_file,
                key_password=self.key_password, ca_certs=self.ca_certs,
                ca_cert_dir=self.ca_cert_dir, ca_cert_data=self.ca_cert_data,
                server_hostname=self.host, ssl_context=context,
            )
        except BaseException:
            sock.close()
            raise
        self.is_verified = True
        DEADLINES.opened(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch_attempt(self)
        super().request(*args, **kwargs)


class AttemptDeadlines:
    """Cuts off a send that outlasts its whole-attempt deadline.

    Socket timeouts bound each read, not the attempt: a receiver that sends
    one byte of its answer every few seconds would hold a sending thread (and
    its lease) for as long as it likes. One watcher thread per process checks
    the sends in flight a few times a second and shuts down the socket of any
    past its deadline; the blocked read then fails like any broken
    connection, and the attempt is recorded as failed.
    """

    TICK_SECONDS: Final = 0.25

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Per watched connection: its deadline, and its socket once it has one.
        self._deadlines: dict[int, tuple[float, HTTPConnection, socket.socket | None]] = {}
        self._thread: threading.Thread | None = None

    def watch(self, connection: HTTPConnection, deadline: float) -> None:
        with self._lock:
            self._deadlines[id(connection)] = (deadline, connection, connection.sock)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="send-deadlines",
                                                daemon=True)
                self._thread.start()

    def opened(self, connection: HTTPConnection) -> None:
        """Note the socket a watched connection just opened.

        Kept here because the connection may let go of it: http.client hands
        the socket to the answer and forgets it when the server closes the
        connection after this answer, which is exactly when it may trickle.
        """
        with self._lock:
            entry = self._deadlines.get(id(connection))
            if entry is not None:
                self._deadlines[id(connection)] = (entry[0], connection, connection.sock)

    def forget(self, connection: object) -> None:
        with self._lock:
            self._deadlines.pop(id(connection), None)

    def _run(self) -> None:
        while True:
            time.sleep(self.TICK_SECONDS)
            now = time.monotonic()
            with self._lock:
                overdue = [(key, sock) for key, (deadline, _connection, sock)
                           in self._deadlines.items() if deadline <= now]
                for key, _sock in overdue:
                    del self._deadlines[key]
            for _key, sock in overdue:
                _cut(sock)


def _cut(sock: socket.socket | None) -> None:
    if sock is None:
        return  # not connected yet: the connect timeout bounds that part
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


DEADLINES: Final = AttemptDeadlines()


class _Attempt(threading.local):
    """This thread's attempt under way: its deadline, and the connections it sent on."""

    deadline: float | None = None
    watched: list[HTTPConnection] | None = None


_attempt = _Attempt()


def _watch_attempt(connection: HTTPConnection) -> None:
    deadline = _attempt.deadline
    if deadline is not None:
        DEADLINES.watch(connection, deadline)
        if _attempt.watched is not None:
            _attempt.watched.append(connection)


@dataclass(frozen=True, slots=True)
class Deadline:
    """When an attempt must be over, on the monotonic clock."""

    at: float

    def passed(self) -> bool:
        """Whether the attempt ran out of time (a failure now is the deadline's cut)."""
        return time.monotonic() >= self.at


@contextlib.contextmanager
def attempt_deadline(seconds: float) -> Iterator[Deadline]:
    """Every request this thread sends in the block, answers read whole, ends within ``seconds``.

    For a caller whose answer must come before something else runs out (a
    refresh under its lease): socket timeouts bound each read, this the
    whole. A request still running at the deadline has its socket shut down
    (:class:`AttemptDeadlines`) and fails like a broken connection. Sends on
    a guarded session or pool only; nested blocks keep the earlier deadline.
    """
    outer, outer_watched = _attempt.deadline, _attempt.watched
    deadline = time.monotonic() + seconds
    if outer is not None:
        deadline = min(deadline, outer)
    watched: list[HTTPConnection] = []
    _attempt.deadline, _attempt.watched = deadline, watched
    try:
        yield Deadline(deadline)
    finally:
        _attempt.deadline, _attempt.watched = outer, outer_watched
        # The answers were read in the block: a kept-alive connection must
        # not be cut later, while it serves another request.
        for connection in watched:
            DEADLINES.forget(connection)


def guarded_pool_classes(policy: OutboundPolicy) -> dict[str, type[HTTPConnectionPool]]:
    """Pool classes for a PoolManager's ``pool_classes_by_scheme``: guarded connections only.

    The policy rides on the classes: a PoolManager builds its pools from
    keyword settings that all go into the pool key, a closed set of urllib3's
    own, so it cannot pass the policy along itself. A pool passes its extra
    keywords on to each connection it opens.
    """

    class GuardedHTTPConnectionPool(HTTPConnectionPool):
        ConnectionCls = GuardedHTTPConnection

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs, policy=policy)

    class GuardedHTTPSConnectionPool(HTTPSConnectionPool):
        ConnectionCls = GuardedHTTPSConnection

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs, policy=policy)

    return {"http": GuardedHTTPConnectionPool, "https": GuardedHTTPSConnectionPool}


class GuardedPoolManager(PoolManager):
    """A PoolManager whose pools open guarded connections only, for both schemes."""

    def __init__(self, policy: OutboundPolicy, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.policy = policy
        self.pool_classes_by_scheme = guarded_pool_classes(policy)


# --- requests: the adapter and the session -----------------------------------------------


class GuardedAdapter(HTTPAdapter):
    """A transport adapter that sends through guarded connections only."""

    def __init__(self, policy: OutboundPolicy) -> None:
        self.policy = policy  # init_poolmanager, called by the base class, needs it
        super().__init__(max_retries=0)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False,
                         **pool_kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = guarded_pool_classes(self.policy)

    def send(self, request: PreparedRequest, stream: bool = False, timeout: Timeout = None,
             verify: bool | str = True, cert: str | tuple[str, str] | None = None,
             proxies: dict[str, str] | None = None) -> Response:
        """Check scheme, TLS and proxies up front; connections check addresses."""
        url = request.url or ""
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or DEFAULT_PORTS.get(parts.scheme, 0)
        self.policy.check_scheme(parts.scheme, host, port)
        destination = _origin(parts.scheme, host, port)
        if not verify:  # False, or an empty CA path that requests would read as "off"
            raise BlockedDestination(destination, "TLS verification cannot be turned off")
        if select_proxy(url, proxies):
            raise BlockedDestination(destination, "proxies are never used for outbound calls")
        return super().send(request, stream=stream, verify=verify, cert=cert, proxies=None,
                            timeout=self.policy.timeout if timeout is None else timeout)


SessionT = TypeVar("SessionT", bound=requests.Session)


def guard_session(session: SessionT, policy: OutboundPolicy) -> SessionT:
    """Route every request of ``session`` through the guard, e.g. an Authlib OAuth2Session.

    On a session that is not a :class:`GuardedSession` every 3xx answer raises
    ``requests.TooManyRedirects`` (requests checks its limit of 0 before it would
    follow, even with ``allow_redirects=False``); nothing is followed either way.
    """
    for adapter in session.adapters.values():
        adapter.close()
    session.adapters.clear()
    adapter = GuardedAdapter(policy)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    session.trust_env = False  # no proxies, .netrc or CA bundle from the environment
    session.proxies.clear()
    session.verify = True
    session.max_redirects = 0
    return session


class GuardedSession(requests.Session):
    """A session that sends only through the guard and returns a 3xx as it came."""

    def __init__(self, policy: OutboundPolicy) -> None:
        super().__init__()
        guard_session(self, policy)
        self.guarded_adapter = self.adapters["https://"]

    def get_adapter(self, url: str) -> BaseAdapter:
        """The guarded adapter, whatever else was mounted later."""
        return self.guarded_adapter

    def get_redirect_target(self, resp: Response) -> str | None:
        """None: a redirect is an answer for the caller, never followed."""
        return None


def guarded_session(policy: OutboundPolicy) -> requests.Session:
    """A new session for outbound calls, guarded by ``policy``."""
    return GuardedSession(policy)


# --- urllib3 directly: for a caller that sends many small requests -------------------------


class GuardedPool:
    """Guarded POSTs straight through urllib3, thread-safe, connections kept alive.

    requests spends about as much CPU on one small POST as the rest of a
    webhook delivery together (cookies, hooks, settings merged per call), so
    the dispatcher sends through this instead. The rules are the same and
    enforced by the same code: the scheme is checked before anything else
    (:meth:`OutboundPolicy.check_scheme`), every connection is opened by the
    guarded pools (checked addresses only), TLS is verified against the CA
    bundle requests uses, a PoolManager never goes through a proxy, and
    redirects are neither followed nor retried. A refusal raises
    :class:`BlockedDestination`; a transport failure raises urllib3's
    ``HTTPError``.
    """

    def __init__(self, policy: OutboundPolicy, connections_per_host: int = 8,
                 ca_certs: str = DEFAULT_CA_BUNDLE_PATH) -> None:
        self.policy = policy
        # ca_certs: which CAs to trust (tests pass their own); verification stays on.
        self._manager = GuardedPoolManager(
            policy, num_pools=100, maxsize=connections_per_host, block=False,
            cert_reqs="CERT_REQUIRED", ca_certs=ca_certs,
        )

    def post(self, url: str, body: bytes, headers: Mapping[str, str],
             timeout: float) -> BaseHTTPResponse:
        """Send one POST; the answer's body is not read (see :func:`finish`)."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or DEFAULT_PORTS.get(parts.scheme, 0)
        self.policy.check_scheme(parts.scheme, host, port)
        # The whole attempt, answer included, ends by this deadline (see
        # AttemptDeadlines); the socket timeouts bound each step within it.
        # The answer is read after this returns, so the watch is ended by
        # :func:`finish`, not here.
        outer = _attempt.deadline
        _attempt.deadline = time.monotonic() + timeout
        try:
            return self._manager.urlopen(
                "POST", url, body=body, headers=dict(headers), redirect=False, retries=False,
                timeout=Urllib3Timeout(connect=timeout, read=timeout), preload_content=False,
            )
        finally:
            _attempt.deadline = outer

    def clear(self) -> None:
        """Close every kept-alive connection."""
        self._manager.clear()


MAX_DRAINED_ANSWER: Final = 64 * 1024


def finish(response: BaseHTTPResponse) -> None:
    """Done with an answer: a short body is read so the connection is kept; else it is closed.

    A receiver's answer is never needed, and one that sends an endless body
    must not hold a sending thread.
    """
    remaining = response.length_remaining
    connection = response.connection
    try:
        if remaining is not None and remaining <= MAX_DRAINED_ANSWER:
            response.drain_conn()
        else:
            response.close()
    finally:
        DEADLINES.forget(connection)
        response.release_conn()


# --- answers of bounded size ------------------------------------------------------------


class AnswerTooLarge(requests.RequestException):
    """The answer's body is longer than the caller allows."""


class _BoundedBody:
    """A response body that refuses to be read past ``limit`` bytes (decoded)."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw = raw
        self._left = limit

    def read(self, amount: int | None = None, **_: Any) -> bytes:
        # requests turns urllib3's errors into its own only when it reads the
        # raw body itself; reading it here, this does the same, so a broken
        # or cut-off answer fails as a RequestException for every caller.
        try:
            chunk: bytes = self._raw.read(amount, decode_content=True)
        except ProtocolError as error:
            raise requests.exceptions.ChunkedEncodingError(error) from error
        except DecodeError as error:
            raise requests.exceptions.ContentDecodingError(error) from error
        except ReadTimeoutError as error:
            raise requests.exceptions.ConnectionError(error) from error
        except SSLError as error:
            raise requests.exceptions.SSLError(error) from error
        self._left -= len(chunk)
        if self._left < 0:
            self._raw.close()
            raise AnswerTooLarge("the answer is longer than allowed")
        return chunk

    def close(self) -> None:
        self._raw.close()

    def release_conn(self) -> None:
        self._raw.release_conn()


def bound_answers(session: SessionT, limit: int) -> SessionT:
    """Make every answer ``session`` receives refuse a body over ``limit`` bytes.

    A response hook runs before requests reads the body, so a declared
    length over the limit is refused unread, and an undeclared one stops as
    soon as it passes the limit: a provider cannot make the gateway hold an
    endless answer in memory.
    """

    def bound(response: Response, *args: Any, **kwargs: Any) -> Response:
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > limit:
            response.close()
            raise AnswerTooLarge(f"the answer declares {declared} bytes, over {limit}")
        response.raw = _BoundedBody(response.raw, limit)
        return response

    session.hooks["response"].append(bound)
    return session
