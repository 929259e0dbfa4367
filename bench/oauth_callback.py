"""Benchmark an OAuth connection's last leg: the provider's return to the webhook's receipt.

    .venv/bin/python bench/oauth_callback.py [--database sqlite|postgres] [--connections N]
                                             [--warmup N]

Everything runs on loopback in a scratch instance (and, for PostgreSQL, a
scratch database), undone afterwards:

- the test OpenID Connect provider of tests/oidc (Node.js; its node modules
  installed with ``npm ci`` when missing, as the tests do), playing the
  third-party service: client ``connect-app``, user ``alice``;
- ``gateway serve`` over TLS with its development certificate, a catalog
  with one oauth type at that provider, a local user, and an API client
  whose webhook URL is the receiver; one real ``gateway worker`` beside it;
- the receiver of bench/webhooks.py in this process (plain http on
  127.0.0.1, allowed through GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS with the
  provider's host, checking every signature, noting when each arrives).

Connections run one after another, each as an MCP server and a user would
make it: the elicitation created through the API; its page opened in the
signed-in browser (one login for the run) and Connect pressed; the login
and consent at the provider; then the provider's redirect to
``/oauth/callback/<type>`` followed, on a new connection (a user's minutes at the
provider outlast the gateway's keep-alive). Measured per connection, from
just before that request: until the browser has the answer (the code
exchanged, userinfo read, the tokens sealed, stored and the elicitation
completed), and until the receiver has the ``elicitation.completed``
webhook. Then the MCP server revokes the credential through the API and
the benchmark waits for that webhook too, so each connection is the user's
first (no previous credential superseded) and starts with an idle outbox.

Like bench/webhooks.py it is a benchmark, not a test: it prints the figures
and exits 0 whatever they are (2 when it cannot set up or a connection fails).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
import servers
import webhooks
from scenarios import Gateway, SetupError

from tests.oidc.fixtures import (
    NodeUnavailable,
    OidcLoginError,
    OidcProvider,
    install_node_modules,
    new_session,
    node_command,
    running_provider,
)

CREDENTIAL_TYPE = "example"
SECRET_ENV = "BENCH_CONNECT_CLIENT_SECRET"  # noqa: S105 (a variable's name, not a secret)
SCOPES = ("openid", "profile", "repo")
USERNAME = "alice"  # the gateway's local user, and the provider's account
WORKERS = 2
THREADS = 32  # gateway serve's default; one request at a time needs few
HTTP_TIMEOUT_S = 30.0
WEBHOOK_TIMEOUT_S = 30.0
_CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')


# --- the scratch instance ---------------------------------------------------------------


def catalog_text(provider: OidcProvider) -> str:
    """The catalog: ``generic`` (every catalog has it) and one oauth type at the test provider."""
    oauth = {"issuer": provider.issuer, "client_id": provider.connect_client_id,
             "client_secret_env": SECRET_ENV, "scopes": list(SCOPES),
             "account_field": "preferred_username"}
    lines = ["[generic]", 'label = "API key"', "", f"[{CREDENTIAL_TYPE}]",
             'label = "Example account"', 'kind = "oauth"', "", f"[{CREDENTIAL_TYPE}.oauth]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in oauth.items()]
    return "\n".join(lines) + "\n"


def instance_environ(folder: Path, provider: OidcProvider, receiver_host: str,
                     database_url: str | None) -> dict[str, str]:
    """The gateway's environment: the catalog, the provider's secret, both hosts allowed."""
    environ = servers.scratch_environ(folder / "instance", servers.free_port(), database_url)
    catalog = folder / "credential_types.toml"
    catalog.write_text(catalog_text(provider))
    environ["GATEWAY_CREDENTIAL_TYPES_FILE"] = str(catalog)
    environ[SECRET_ENV] = provider.connect_client_secret
    # Both plain http on loopback: the provider (its token and userinfo
    # endpoints) and the receiver, each by host and port.
    environ["GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS"] = \
        f"{urlsplit(provider.issuer).netloc},{receiver_host}"
    environ["GATEWAY_LOG_LEVEL"] = "info"  # the worker says "worker started"
    return environ


@contextmanager
def provider_running(folder: Path) -> Iterator[OidcProvider]:
    """The test provider, started as the test suite starts it; stopped afterwards."""
    try:
        node = node_command()
        install_node_modules()
    except NodeUnavailable as error:
        raise servers.BenchSetupError(str(error).splitlines()[0], str(error)) from None
    with ExitStack() as stack:
        try:
            provider = stack.enter_context(running_provider(node, folder / "provider.log"))
        except RuntimeError as error:
            raise servers.BenchSetupError("the OpenID Connect provider did not start",
                                          str(error)) from None
        yield provider


def cli_json(gateway: Gateway, *args: str, stdin: str | None = None) -> dict[str, Any]:
    """``gateway ARGS --json`` against the instance; what it printed."""
    printed: dict[str, Any] = json.loads(gateway.cli(*args, "--json", stdin=stdin))
    return printed


# --- the two parties: the MCP server and the user's browser -------------------------------


@dataclass
class Parties:
    """The MCP server's API session and the user's signed-in browser, both kept alive."""

    base_url: str
    api: requests.Session
    browser: requests.Session
    subject: dict[str, str]

    def close(self) -> None:
        self.api.close()
        self.browser.close()


def https_session(cafile: Path) -> requests.Session:
    """A session trusting the gateway's development certificate, ignoring proxy settings."""
    session = new_session()
    session.verify = str(cafile)
    return session


def expect(response: requests.Response, status: int, what: str) -> requests.Response:
    """``response`` if it has ``status``; otherwise the benchmark cannot go on."""
    if response.status_code != status:
        raise servers.BenchSetupError(f"{what} answered {response.status_code}, not {status}",
                                      response.text[:2000])
    return response


def csrf_token(response: requests.Response, what: str) -> str:
    """The CSRF token of the form on a page."""
    found = _CSRF_FIELD.search(expect(response, 200, what).text)
    if not found:
        raise servers.BenchSetupError(f"{what}: no form with a CSRF token")
    return found.group(1)


def sign_up(gateway: Gateway, receiver: webhooks.Receiver, webhook_url: str) -> Parties:
    """An API client whose webhook is the receiver, a local user, and that user signed in."""
    minted = cli_json(gateway, "clients", "create", "bench-oauth", "--webhook-url", webhook_url)
    receiver.secret = minted["webhook_secret"]
    password = secrets.token_urlsafe(18)
    user = cli_json(gateway, "users", "create", USERNAME, "--password-stdin",
                    stdin=password + "\n")
    base_url = gateway.environ["GATEWAY_PUBLIC_URL"]
    api = https_session(gateway.cafile)
    api.headers["Authorization"] = f"Bearer {minted['api_token']}"
    browser = https_session(gateway.cafile)
    token = csrf_token(browser.get(f"{base_url}/login", timeout=HTTP_TIMEOUT_S), "GET /login")
    expect(browser.post(f"{base_url}/login", allow_redirects=False, timeout=HTTP_TIMEOUT_S,
                        data={"csrf_token": token, "username": USERNAME, "password": password,
                              "next": "/"}), 303, "logging in")
    return Parties(base_url, api, browser, dict(user["subject"]))


# --- one connection ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connection:
    """One connection's times (monotonic): the callback sent, answered, its webhook received.

    ``settled``: the revocation's webhook came too, before the next connection began.
    """

    elicitation_id: str
    sent: float
    answered: float
    received: float | None
    settled: bool


def to_the_provider_and_back(parties: Parties, provider: OidcProvider) -> tuple[str, str]:
    """Create, open, press Connect, log in and allow at the provider; (id, callback URL)."""
    base_url = parties.base_url
    created = expect(parties.api.post(f"{base_url}/api/v1/elicitations", timeout=HTTP_TIMEOUT_S,
                                      json={"subject": parties.subject, "kind": "oauth",
                                            "credential_type": CREDENTIAL_TYPE,
                                            "message": "Connect your Example account",
                                            "reuse_pending": False}),
                     201, "creating an elicitation").json()
    page = f"{base_url}/e/{created['id']}"
    token = csrf_token(parties.browser.get(page, timeout=HTTP_TIMEOUT_S), "GET /e/<id>")
    pressed = expect(parties.browser.post(f"{page}/connect", data={"csrf_token": token},
                                          allow_redirects=False, timeout=HTTP_TIMEOUT_S),
                     303, "POST /e/<id>/connect")
    try:
        # A new provider session each time: the login and the consent page, every time.
        back = provider.connect_login(pressed.headers["Location"], USERNAME,
                                      session=new_session())
    except OidcLoginError as error:
        raise servers.BenchSetupError("the login at the provider failed", str(error)) from None
    if not back.startswith(f"{base_url}/oauth/callback/{CREDENTIAL_TYPE}?"):
        raise servers.BenchSetupError(f"the provider sent the browser to {back[:200]}")
    return str(created["id"]), back


def arrival(receiver: webhooks.Receiver, elicitation_id: str) -> float | None:
    """When the elicitation's webhook arrived; None if not within WEBHOOK_TIMEOUT_S."""
    deadline = time.monotonic() + WEBHOOK_TIMEOUT_S
    while True:
        with receiver.lock:
            received = receiver.arrivals.get(elicitation_id)
        if received is not None or time.monotonic() > deadline:
            return received
        time.sleep(0.005)  # the receiver notes the time itself; this only polls for it


def revoke_and_settle(parties: Parties, receiver: webhooks.Receiver, webhooks_due: int) -> bool:
    """Revoke the live credentials as the MCP server would; whether all webhooks came in time."""
    listed = expect(parties.api.get(f"{parties.base_url}/api/v1/credentials",
                                    timeout=HTTP_TIMEOUT_S), 200, "listing credentials")
    for credential in listed.json()["items"]:
        expect(parties.api.delete(f"{parties.base_url}/api/v1/credentials/{credential['id']}",
                                  timeout=HTTP_TIMEOUT_S), 200, "revoking a credential")
        webhooks_due += 1
    deadline = time.monotonic() + WEBHOOK_TIMEOUT_S
    while receiver.count() < webhooks_due and time.monotonic() < deadline:
        time.sleep(0.005)
    return receiver.count() >= webhooks_due


def connect_once(parties: Parties, provider: OidcProvider,
                 receiver: webhooks.Receiver) -> Connection:
    """One connection from the API's create to the revocation's webhook; its times."""
    webhooks_due = receiver.count() + 1
    elicitation_id, callback = to_the_provider_and_back(parties, provider)
    # A user's time at the provider outlasts the gateway's keep-alive (5 s):
    # the browser comes back on a new connection, TLS handshake and all.
    parties.browser.close()
    sent = time.monotonic()
    answer = parties.browser.get(callback, allow_redirects=False, timeout=HTTP_TIMEOUT_S)
    answered = time.monotonic()
    if "is connected" not in expect(answer, 200, f"GET /oauth/callback/{CREDENTIAL_TYPE}").text:
        raise servers.BenchSetupError("the callback's page does not say the account is "
                                      "connected", answer.text[:2000])
    received = arrival(receiver, elicitation_id)
    settled = revoke_and_settle(parties, receiver, webhooks_due)
    return Connection(elicitation_id, sent, answered, received, settled)


# --- output -----------------------------------------------------------------------------


def milliseconds(values: list[float]) -> list[str]:
    """p50, p90, p99 and the maximum of ``values`` (seconds), in milliseconds."""
    return [f"{webhooks.percentile(values, share) * 1000:.1f} ms" for share in (0.5, 0.9, 0.99)] \
        + [f"{max(values, default=float('nan')) * 1000:.1f} ms"]


def print_report(args: argparse.Namespace, database: str, provider: OidcProvider,
                 receiver_host: str, receiver: webhooks.Receiver,
                 connections: list[Connection]) -> None:
    receipts = [c.received - c.sent for c in connections if c.received is not None]
    answers = [c.answered - c.sent for c in connections]
    early = sum(1 for c in connections if c.received is not None and c.received < c.answered)
    with receiver.lock:
        duplicates = sum(n - 1 for n in receiver.ids.values())
        bad_signatures = receiver.bad_signatures
    print(f"oauth callback benchmark: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{platform.machine()}, {os.cpu_count()} cores, load "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"database: {database}; `gateway serve` {WORKERS} workers x {THREADS} threads, "
          "TLS on loopback; one `gateway worker`")
    print(f"provider: tests/oidc at {provider.issuer}, client connect-app, scopes "
          f"{' '.join(SCOPES)}")
    print(f"receiver: plain http on {receiver_host} (loopback, allowed by "
          "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS), signatures verified")
    print(f"connections: {len(connections)} measured, one after another, after "
          f"{args.warmup} unmeasured; each callback on a new TLS connection")
    print()
    rows = [
        ("from the callback's GET to", "p50", "p90", "p99", "max"),
        ("the webhook's receipt", *milliseconds(receipts)),
        ("the callback's answer", *milliseconds(answers)),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for n, row in enumerate(rows):
        print("  ".join(cell.rjust(width) if i else cell.ljust(width)
                        for i, (cell, width) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * width for width in widths))
    print()
    unsettled = sum(1 for c in connections if not c.settled)
    print(f"completions' webhooks received / connections: {len(receipts)} / "
          f"{len(connections)} ({early} before the callback's answer)")
    print(f"revocations' webhooks late (after {WEBHOOK_TIMEOUT_S:.0f} s): {unsettled}; "
          f"duplicate deliveries: {duplicates}; bad signatures: {bad_signatures}")


# --- main -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark an OAuth connection's callback to its webhook, on loopback.")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite",
                        help="postgres: a scratch database on TEST_DATABASE_URL "
                             f"(default {servers.DEFAULT_POSTGRES_URL})")
    parser.add_argument("--connections", type=int, default=50,
                        help="connections measured, one after another (default 50)")
    parser.add_argument("--warmup", type=int, default=10,
                        help="unmeasured connections first, so that each gateway worker has "
                             "discovered the provider and fetched its keys (default 10)")
    args = parser.parse_args(argv)
    if args.connections < 1 or args.warmup < 0:
        parser.error("--connections must be at least 1 and --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    receiver = webhooks.Receiver()
    try:
        with tempfile.TemporaryDirectory(prefix="gateway-bench-oauth-") as scratch, \
                servers.scratch_database(args.database) as database_url, \
                webhooks.serve_receiver(receiver) as receiver_host, \
                provider_running(Path(scratch)) as provider:
            folder = Path(scratch)
            environ = instance_environ(folder, provider, receiver_host, database_url)
            public_url = environ["GATEWAY_PUBLIC_URL"]
            provider.add_connect_redirect_uri(f"{public_url}/oauth/callback/{CREDENTIAL_TYPE}")
            servers.init_instance(environ, folder)
            options = servers.gateway_options(urlsplit(public_url).port or 443, WORKERS,
                                              THREADS, folder / "instance")
            with servers.run_gateway(environ, folder, options) as gateway, \
                    webhooks.worker(environ, folder, "worker"):
                parties = sign_up(gateway, receiver, f"http://{receiver_host}/hooks")
                try:
                    for _ in range(args.warmup):
                        connect_once(parties, provider, receiver)
                    connections = [connect_once(parties, provider, receiver)
                                   for _ in range(args.connections)]
                finally:
                    parties.close()
            print_report(args, servers.describe_database(database_url), provider,
                         receiver_host, receiver, connections)
    except (servers.BenchSetupError, SetupError) as error:
        print(f"bench: {error}", file=sys.stderr)
        if isinstance(error, servers.BenchSetupError) and error.detail:
            print(error.detail, file=sys.stderr)
        return 2
    except requests.RequestException as error:
        print(f"bench: a request to the gateway failed: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        with suppress(Exception):
            print("bench: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
