"""``gateway serve``: real gunicorn, real TLS, the headers a browser sees."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import signal
import socket
import ssl
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlencode

import pytest
from cryptography import x509
from sqlalchemy import Engine, create_engine, func, select, text

from gateway.audit.models import AuditEvent
from gateway.db import POSTGRES_CONNECTIONS_PER_PROCESS
from gateway.serving.affinity import pins
from gateway.serving.cli import MAX_WORKERS, _warn_if_connections_may_run_out, default_workers
from gateway.serving.tls import dev_certificate_paths, make_self_signed
from tests.integration.conftest import Result, Server, free_port, tls_context
from tests.oidc.fixtures import OidcProvider

pytestmark = pytest.mark.slow


def get(server: Server, path: str, context: ssl.SSLContext | None,
        headers: dict[str, str] | None = None,
        method: str = "GET") -> http.client.HTTPResponse:
    connection: http.client.HTTPConnection
    if context is None:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    else:
        connection = http.client.HTTPSConnection("localhost", server.port, timeout=10,
                                                 context=context)
    connection.request(method, path, headers={"Host": "localhost", **(headers or {})})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_healthz_over_tls_with_the_generated_certificate(
    start_server: Callable[..., Server], instance_path: Path,
) -> None:
    server = start_server()
    certfile, keyfile = dev_certificate_paths(instance_path)
    assert stat.S_IMODE(keyfile.stat().st_mode) == 0o600
    certificate = x509.load_pem_x509_certificate(certfile.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert "127.0.0.1" in {str(a) for a in names.get_values_for_type(x509.IPAddress)}

    response = get(server, "/healthz", tls_context(certfile))
    assert response.status == 200
    headers = response.headers
    assert headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"
    assert headers["Cache-Control"] == "no-store"
    csp = headers["Content-Security-Policy"]
    for directive in ("default-src 'none'", "object-src 'none'", "base-uri 'none'",
                      "frame-ancestors 'none'", "form-action 'self'", "script-src 'none'"):
        assert directive in csp

    assert get(server, "/readyz", tls_context(certfile)).status == 200
    assert get(server, "/", tls_context(certfile), {"Host": "evil.example"}).status == 400
    assert '"GET /healthz HTTP/1.1" 200' in server.output()


def test_the_certificate_is_reused_on_the_next_start(
    start_server: Callable[..., Server], instance_path: Path,
) -> None:
    start_server().process.terminate()
    certfile, _ = dev_certificate_paths(instance_path)
    first = certfile.read_bytes()
    start_server()
    assert certfile.read_bytes() == first


def test_plain_http_is_not_served_on_the_tls_port(
    start_server: Callable[..., Server], instance_path: Path,
) -> None:
    server = start_server()
    # Nothing answers in plain HTTP on the TLS port: the handshake fails.
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        get(server, "/api/v1/elicitations", None)


def test_behind_a_proxy_plain_http_pages_redirect_and_the_api_refuses(
    start_server: Callable[..., Server], cli_environ: dict[str, str],
) -> None:
    server = start_server("--no-tls", env={**cli_environ, "GATEWAY_PROXY_HOPS": "1"})
    assert "GATEWAY_PROXY_HOPS=1: trusting the last entry of X-Forwarded-For" in server.output()
    forwarded_http = {"X-Forwarded-Proto": "http", "X-Forwarded-For": "203.0.113.9"}
    page = get(server, "/e/abc?x=1", None, forwarded_http)
    assert page.status == 301
    assert page.headers["Location"] == "https://localhost:8443/e/abc?x=1"
    api = get(server, "/api/v1/elicitations", None, forwarded_http, method="POST")
    assert api.status == 403
    assert api.headers["Content-Type"] == "application/problem+json"
    assert "Location" not in api.headers
    forwarded_https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
    assert get(server, "/", None, forwarded_https).status == 200
    assert get(server, "/", None, {}).status == 301


def test_serve_starts_one_worker_per_cpu_by_default(
    start_server: Callable[..., Server],
) -> None:
    # Nothing configured: rate limits in memory, the embedded database or
    # the suite's PostgreSQL, no --workers.
    server = start_server("--no-worker", workers=None)
    cpus = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1, MAX_WORKERS)
    assert default_workers() == cpus
    assert len(_workers_listening(server, count=cpus)) == cpus
    if cpus > 1:
        assert (f"API rate limits are counted in each worker's memory: with {cpus} workers "
                f"a client may get up to {cpus} times each limit") in server.output()


def test_per_worker_limits_is_gone(run_gateway: Callable[..., Result]) -> None:
    result = run_gateway("serve", "--workers", "2", "--per-worker-limits")
    assert result.code == 2
    assert "--per-worker-limits" in result.stderr.splitlines()[-1]


def test_no_tls_without_a_proxy_is_refused(run_gateway: Callable[..., Result]) -> None:
    result = run_gateway("serve", "--no-tls")
    assert result.code == 1
    assert "GATEWAY_PROXY_HOPS" in result.stderr


def test_port_in_use_stops_with_one_line(run_gateway: Callable[..., Result]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_gateway("serve", "--port", str(port))
    assert result.code == 1
    assert result.stderr.strip() == f"Error: port {port} on 127.0.0.1 is already in use"


def test_a_second_server_on_a_running_gateways_port_is_refused(
    start_server: Callable[..., Server], run_gateway: Callable[..., Result],
) -> None:
    # The workers' sockets let other sockets share their port (SO_REUSEPORT);
    # a second instance must not silently take half of the first's connections.
    server = start_server("--no-worker")
    result = run_gateway("serve", "--port", str(server.port), "--no-worker")
    assert result.code == 1
    assert result.stderr.strip() == f"Error: port {server.port} on 127.0.0.1 is already in use"


def test_connections_are_spread_over_the_workers(
    start_server: Callable[..., Server], instance_path: Path,
) -> None:
    server = start_server("--workers", "2", "--no-worker")
    workers = _workers_listening(server, count=2)
    listening = {pid: _sockets_of(pid) & _port_sockets(server.port, _LISTEN) for pid in workers}
    # A socket of its own in each worker, none shared and none in the master:
    # the kernel, not a race between the workers, picks each connection's worker.
    assert all(len(inodes) == 1 for inodes in listening.values()), listening
    assert len(set.union(*listening.values())) == 2
    assert not _sockets_of(server.process.pid) & _port_sockets(server.port, _LISTEN)
    # The log names the address served, and no empty one for the master.
    assert f"on https://127.0.0.1:{server.port}" in server.output()
    assert "Listening at:" not in server.output()

    # Kept open, as a client's pool of connections is: with 16, all on one
    # worker would happen by chance once in 32,768 runs.
    context = tls_context(dev_certificate_paths(instance_path)[0])
    connections = [http.client.HTTPSConnection("localhost", server.port, timeout=10,
                                                context=context) for _ in range(16)]
    try:
        for connection in connections:
            connection.request("GET", "/healthz", headers={"Host": "localhost"})
            assert connection.getresponse().read()
        held = {pid: len(_sockets_of(pid) & _port_sockets(server.port, _ESTABLISHED))
                for pid in workers}
    finally:
        for connection in connections:
            connection.close()
    assert sum(held.values()) == 16
    assert all(held.values()), held


GUESSES = 60
LOGIN_LIMIT = 10  # GATEWAY_RATELIMIT_LOGIN's default, "10 per 15 minutes"
PASSWORD = "correct horse battery staple"


def log_in(server: Server, context: ssl.SSLContext, username: str, password: str) -> int:
    """A browser's login on connections of its own: the form, then its post; the status."""
    form = http.client.HTTPSConnection("localhost", server.port, timeout=120, context=context)
    form.request("GET", "/login", headers={"Host": "localhost"})
    page = form.getresponse()
    body = page.read().decode()
    form.close()
    cookie = page.headers["Set-Cookie"].split(";", 1)[0]
    match = re.search(r'name="csrf_token" value="([^"]+)"', body)
    assert match, body
    post = http.client.HTTPSConnection("localhost", server.port, timeout=120, context=context)
    post.request("POST", "/login", body=urlencode(
        {"csrf_token": match[1], "username": username, "password": password, "next": "/"}),
        headers={"Host": "localhost", "Cookie": cookie,
                 "Content-Type": "application/x-www-form-urlencoded"})
    answer = post.getresponse()
    answer.read()
    post.close()
    return answer.status


def test_guesses_at_once_on_two_workers_check_at_most_the_limits_passwords(
    start_server: Callable[..., Server], run_gateway: Callable[..., Result],
    instance_path: Path, engine: Engine,
) -> None:
    created = run_gateway("users", "create", "alice", "--password-stdin", stdin=PASSWORD)
    assert created.code == 0, created.stderr
    # Nothing but the database shared between the workers: no Redis. The
    # kernel spreads the guesses' connections over both workers
    # (test_connections_are_spread_over_the_workers).
    server = start_server("--no-worker", workers="2")
    assert len(_workers_listening(server, count=2)) == 2
    context = tls_context(dev_certificate_paths(instance_path)[0])
    with ThreadPoolExecutor(GUESSES) as guessers:
        answers = list(guessers.map(
            lambda number: log_in(server, context, "alice", f"guess-number-{number}"),
            range(GUESSES)))
    last = log_in(server, context, "alice", PASSWORD)

    assert sorted(answers) == [401] * LOGIN_LIMIT + [429] * (GUESSES - LOGIN_LIMIT)
    assert last == 429
    # A refused attempt never reached the password check: only checked ones are audited.
    with engine.connect() as connection:
        failed = connection.scalar(select(func.count()).select_from(AuditEvent).where(
            AuditEvent.action == "login.failed"))
    assert failed == LOGIN_LIMIT


# One worker per CPU this test may use, as on the 2-CPU machines it runs on.
CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_cpus = pytest.mark.skipif(not pins(len(CPUS)) or len(CPUS) > 8,
                                reason="needs Linux with 2 to 8 CPUs")


@needs_cpus
def test_pinned_with_a_worker_per_cpu_each_runs_on_a_cpu_of_its_own(
    start_server: Callable[..., Server],
) -> None:
    server = start_server("--workers", str(len(CPUS)), "--no-worker",
                          "--pin-workers")
    workers = _workers_listening(server, count=len(CPUS))
    placed = {pid: os.sched_getaffinity(pid) for pid in workers}
    assert sorted(cpu for cpus in placed.values() for cpu in cpus) == CPUS, placed
    # The server itself, which only watches its workers, is not pinned.
    assert os.sched_getaffinity(server.process.pid) == set(CPUS)

    # A worker that dies is replaced on the CPU it left.
    dead, *kept = workers
    os.kill(dead, signal.SIGKILL)
    replacement = _replacement_of(server, dead, set(kept))
    assert os.sched_getaffinity(replacement) == placed[dead]
    assert all(os.sched_getaffinity(pid) == placed[pid] for pid in kept)


@needs_cpus
@pytest.mark.parametrize("placement", [("--pin-workers", "--workers", "1"), ()],
                         ids=["fewer-workers-than-cpus", "not-asked"])
def test_otherwise_the_kernel_places_the_workers(
    start_server: Callable[..., Server], placement: tuple[str, ...],
) -> None:
    # Even when asked, several single-worker servers on one host must not all
    # crowd one CPU.
    server = start_server("--workers", str(len(CPUS)), "--no-worker",
                          *placement)
    workers = _workers_listening(server, count=1 if "--workers" in placement else len(CPUS))
    assert all(os.sched_getaffinity(pid) == set(CPUS) for pid in workers)


def _replacement_of(server: Server, dead: int, kept: set[int], timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = set(_workers_listening(server, count=len(kept) + 1))
        if dead not in workers:
            (replacement,) = workers - kept
            return replacement
        time.sleep(0.1)
    raise AssertionError(f"worker {dead} was not replaced:\n{server.output()}")


_LISTEN, _ESTABLISHED = "0A", "01"


def _workers_listening(server: Server, count: int, timeout: float = 30) -> list[int]:
    """The server's worker processes, once ``count`` of them listen on its port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children")
        workers = [int(pid) for pid in children.read_text().split()]
        listening = _port_sockets(server.port, _LISTEN)
        if len(workers) == count and all(_sockets_of(pid) & listening for pid in workers):
            return workers
        time.sleep(0.1)
    raise AssertionError(f"{count} workers did not start listening:\n{server.output()}")


def _port_sockets(port: int, state: str) -> set[str]:
    """Inodes of the TCP sockets on this local port in this state (/proc/net/tcp's codes)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                inodes.add(fields[9])
    return inodes


def _sockets_of(pid: int) -> set[str]:
    """Inodes of the sockets process ``pid`` has open."""
    inodes: set[str] = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except FileNotFoundError:
        return inodes  # it ended meanwhile (a worker killed on purpose)
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    return inodes


def test_missing_certificate_file_stops_with_one_line(run_gateway: Callable[..., Result],
                                                      tmp_path: Path) -> None:
    result = run_gateway("serve", "--certfile", str(tmp_path / "nope.pem"),
                         "--keyfile", str(tmp_path / "nope-key.pem"))
    assert result.code == 1
    assert result.stderr.strip() == f"Error: certificate file {tmp_path / 'nope.pem'} " \
        "does not exist"


def test_key_file_readable_by_others_stops(run_gateway: Callable[..., Result],
                                           tmp_path: Path) -> None:
    cert, key = make_self_signed(("localhost",), ())
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    (tmp_path / "key.pem").chmod(0o644)
    result = run_gateway("serve", "--certfile", str(tmp_path / "cert.pem"),
                         "--keyfile", str(tmp_path / "key.pem"))
    assert result.code == 1
    assert "is readable by group or others (mode 0644); run: chmod 600" in result.stderr


def test_configured_certificate_is_used(start_server: Callable[..., Server], tmp_path: Path,
                                        cli_environ: dict[str, str]) -> None:
    cert, key = make_self_signed(("localhost",), ("127.0.0.1",))
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    (tmp_path / "key.pem").chmod(0o600)
    env = {**cli_environ, "GATEWAY_TLS_CERTFILE": str(tmp_path / "cert.pem"),
           "GATEWAY_TLS_KEYFILE": str(tmp_path / "key.pem")}
    server = start_server(env=env)
    assert get(server, "/healthz", tls_context(tmp_path / "cert.pem")).status == 200


def test_a_public_host_without_a_certificate_is_refused(run_gateway: Callable[..., Result],
                                                        cli_environ: dict[str, str]) -> None:
    env = {**cli_environ, "GATEWAY_PUBLIC_URL": "https://portal.example.com"}
    result = run_gateway("serve", env=env)
    assert result.code == 1
    assert "no TLS certificate for portal.example.com" in result.stderr


def test_an_unmigrated_database_is_refused(run_gateway: Callable[..., Result],
                                           cli_environ: dict[str, str],
                                           empty_database_url: str) -> None:
    result = run_gateway("serve", env={**cli_environ, "GATEWAY_DATABASE_URL": empty_database_url})
    assert result.code == 1
    assert "run `gateway db upgrade` first" in result.stderr


OIDC = {"GATEWAY_LOGIN_BACKEND": "oidc", "GATEWAY_OIDC_CLIENT_ID": "gateway",
        "GATEWAY_OIDC_CLIENT_SECRET": "s" * 20}
GUARD_HTTP = "plain http only to hosts listed in GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS"


def test_an_issuer_the_outbound_guard_refuses_stops_the_start(
    run_gateway: Callable[..., Result], cli_environ: dict[str, str],
) -> None:
    result = run_gateway("serve", env={**cli_environ, **OIDC,
                                       "GATEWAY_OIDC_ISSUER": "http://127.0.0.1:9"})
    assert result.code == 1
    assert result.stderr.strip() == (
        f"Error: GATEWAY_OIDC_ISSUER: the outbound guard refuses http://127.0.0.1:9 ({GUARD_HTTP}),"
        " so nobody can log in; use the identity provider's https issuer")


def test_a_check_url_the_outbound_guard_refuses_stops_the_start(
    run_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
) -> None:
    catalog = tmp_path / "types.toml"
    catalog.write_text('[generic]\nlabel = "API key"\n[local]\nlabel = "Local key"\n'
                       '[local.check]\nurl = "http://127.0.0.1:8000/check"\nheader = "X-Key"\n')
    result = run_gateway("serve", env={**cli_environ,
                                       "GATEWAY_CREDENTIAL_TYPES_FILE": str(catalog)})
    assert result.code == 1
    assert result.stderr.strip() == (
        f"Error: [local.check] url in {catalog} (GATEWAY_CREDENTIAL_TYPES_FILE): the outbound "
        f"guard refuses http://127.0.0.1:8000 ({GUARD_HTTP}), so no Local key can be checked, "
        "and none stored")


def test_a_silent_provider_and_a_refused_webhook_url_are_warned_of_and_it_starts(
    run_gateway: Callable[..., Result], start_server: Callable[..., Server],
    cli_environ: dict[str, str],
) -> None:
    receiver, silent = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    created = run_gateway("clients", "create", "Hooked MCP", "--webhook-url",
                          f"http://{receiver}/hooks", "--json",
                          env={**cli_environ, "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": receiver})
    assert created.code == 0, created.stderr
    client_id = json.loads(created.stdout)["client_id"]
    server = start_server(env={**cli_environ, **OIDC, "GATEWAY_OIDC_ISSUER": f"http://{silent}",
                               "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": silent})
    output = server.output()
    assert (f"WARNING gateway.serving.cli: GATEWAY_OIDC_ISSUER: the identity provider cannot be "
            f"reached at http://{silent}/.well-known/openid-configuration (ConnectionError); "
            "logins fail until that is fixed\n") in output
    assert (f"WARNING gateway.serving.cli: webhook URL of client {client_id} (Hooked MCP): the "
            f"outbound guard refuses http://{receiver} ({GUARD_HTTP}), so every webhook to it "
            f"fails; change it with `gateway clients set-webhook-url {client_id} URL`\n") in output
    context = tls_context(dev_certificate_paths(Path(cli_environ["GATEWAY_INSTANCE_PATH"]))[0])
    assert get(server, "/healthz", context).status == 200


def test_more_workers_than_postgresql_has_connections_for_are_warned_about(
    start_server: Callable[..., Server], database_url: str,
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite has no connection limit")
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            limit = int(connection.execute(text("SHOW max_connections")).scalar_one())
    finally:
        engine.dispose()
    one = start_server("--no-worker")
    assert "PostgreSQL has" not in one.output()
    too_many = limit // POSTGRES_CONNECTIONS_PER_PROCESS + 1
    crowded = start_server("--workers", str(too_many), "--no-worker")
    warning = next(line for line in crowded.output().splitlines() if "PostgreSQL has" in line)
    assert f"{too_many} workers may open up to {too_many * POSTGRES_CONNECTIONS_PER_PROCESS}" \
        in warning
    assert f"max_connections {limit}" in warning
    assert "Start fewer workers, or raise max_connections" in warning


def test_a_server_that_will_not_tell_its_limit_does_not_stop_the_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unreachable = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/gateway")
    try:
        with caplog.at_level(logging.INFO):
            _warn_if_connections_may_run_out(unreachable, workers=64)
    finally:
        unreachable.dispose()
    assert "connection limit is unknown (OperationalError)" in caplog.text
    assert "PostgreSQL has" not in caplog.text


def test_an_oauth_type_whose_secret_is_not_set_stops_the_start_naming_the_variable(
    run_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
) -> None:
    catalog = tmp_path / "types.toml"
    catalog.write_text('[generic]\nlabel = "Key"\n[github-oauth]\nlabel = "GitHub account"\n'
                       'kind = "oauth"\n[github-oauth.oauth]\n'
                       'authorization_url = "https://github.com/login/oauth/authorize"\n'
                       'token_url = "https://github.com/login/oauth/access_token"\n'
                       'client_id = "abc"\nclient_secret_env = "GITHUB_OAUTH_CLIENT_SECRET"\n')
    result = run_gateway("serve", env={**cli_environ,
                                       "GATEWAY_CREDENTIAL_TYPES_FILE": str(catalog)})
    assert result.code == 1
    [line] = result.stderr.strip().splitlines()
    assert "GITHUB_OAUTH_CLIENT_SECRET" in line
    assert "[github-oauth.oauth]" in line


def test_an_oauth_provider_whose_discovery_lacks_pkce_s256_stops_the_start(
    run_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
    oidc_provider: OidcProvider,
) -> None:
    oidc_provider.set_discovery(code_challenge_methods_supported=["plain"])
    catalog = tmp_path / "types.toml"
    catalog.write_text('[generic]\nlabel = "Key"\n[example]\nlabel = "Example account"\n'
                       'kind = "oauth"\n[example.oauth]\n'
                       f'issuer = "{oidc_provider.issuer}"\nclient_id = "connect-app"\n'
                       'token_auth_method = "none"\n')
    result = run_gateway("serve", "--port", str(free_port()), env={
        **cli_environ, "GATEWAY_CREDENTIAL_TYPES_FILE": str(catalog),
        "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": oidc_provider.issuer.removeprefix("http://")})
    assert result.code == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: [example.oauth] issuer: ")
    assert "does not list S256 in code_challenge_methods_supported" in line
