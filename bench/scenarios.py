"""The benchmark's scenarios: one request each, sent alike to the gateway and the bare app.

A scenario says what wrk sends (method, path, headers, body), what the bare
app answers on that path, and optionally a setup hook that runs once against
the started gateway (to create an API client, say) and returns the request to
send, token included. Both targets then get byte-for-byte the same request.

A scenario may also hold requests open in the background while wrk measures
(``hold``): say 500 long-polls that each wait 60 s, re-issued as each returns,
to see what parked requests cost everyone else. The bare app answers those on
a view that sleeps (see :func:`long_poll`).

Add a scenario with ``register(Scenario(...))`` at the bottom of this file.
This module is imported by the bare app too, so it must not import the
gateway: the baseline would no longer be bare.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import re
import secrets
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from flask import Response, jsonify, request
from flask.typing import ResponseReturnValue


class SetupError(Exception):
    """A scenario's setup could not prepare the gateway; the message says why."""


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request, as wrk sends it on every connection.

    With ``paths``, wrk sends each request to the next of these paths instead
    of ``path`` (same method, headers and body), cycling over them; ``path``
    is then the one checked before load, normally the first of them.
    """

    method: str = "GET"
    path: str = "/"
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None
    paths: tuple[str, ...] = ()

    @classmethod
    def with_json(cls, method: str, path: str, payload: Any,
                  headers: Mapping[str, str] | None = None) -> Request:
        """A request carrying ``payload`` as a JSON body, with its Content-Type."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        merged = {"Content-Type": "application/json", **(headers or {})}
        return cls(method=method, path=path, headers=merged, body=body)

    def with_header(self, name: str, value: str) -> Request:
        """The same request with one more (or one replaced) header."""
        return dataclasses.replace(self, headers={**self.headers, name: value})


def send(host: str, port: int, request: Request, cafile: Path,
         timeout: float = 10.0) -> tuple[int, bytes]:
    """Send one request over TLS verified against ``cafile``; its status and body.

    http.client, not urllib: a redirect must be seen as a redirect, not followed.
    """
    context = ssl.create_default_context(cafile=str(cafile))
    connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    try:
        connection.request(request.method, request.path, body=request.body,
                           headers=dict(request.headers))
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@dataclass(frozen=True, slots=True)
class Gateway:
    """The started gateway, as a scenario's setup hook sees it."""

    host: str
    port: int
    instance_path: Path
    environ: Mapping[str, str]
    command: tuple[str, ...]
    cafile: Path

    @property
    def base_url(self) -> str:
        """The URL wrk is pointed at, without a path."""
        return f"https://{self.host}:{self.port}"

    def cli(self, *args: str, stdin: str | None = None,
            extra_environ: Mapping[str, str] | None = None) -> str:
        """Run ``gateway ARGS`` against this instance and return what it printed."""
        result = subprocess.run([*self.command, *args],
                                env={**self.environ, **(extra_environ or {})}, input=stdin,
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise SetupError(f"`gateway {' '.join(args)}` exited {result.returncode}: {last}")
        return result.stdout

    def send(self, request: Request) -> tuple[int, bytes]:
        """Send one request to this gateway; its status and body."""
        return send(self.host, self.port, request, self.cafile)


# Called with the rule's variables as keyword arguments, as Flask calls views.
View = Callable[..., ResponseReturnValue]
# Runs once, after both servers answer and before any load; gets the
# scenario's request and returns the one to send (e.g. with a bearer token).
Setup = Callable[[Gateway, Request], Request]


def _rule_of(path: str, bare_rule: str | None) -> str:
    return bare_rule or urlsplit(path).path


@dataclass(frozen=True, slots=True)
class Hold:
    """Requests kept open against a target, in the background, while wrk measures it.

    ``count`` connections each send ``request``, wait for the answer, and send
    it again at once, so ``count`` requests are in flight (or queued) all the
    time. The report says how many were answered, and how, on each target.
    """

    request: Request
    count: int
    # The bare app's answer; for a long-poll, one that sleeps (see long_poll).
    bare_view: View
    expected_status: int = 200
    setup: Setup | None = None
    bare_rule: str | None = None
    # Seconds to let the server take the held requests in (TLS handshakes,
    # authentication, parking) after they are sent and before wrk starts, so
    # the measurement sees them held, not arriving.
    settle_s: float = 0.0
    # After wrk stops: seconds to let the requests in flight be answered (none
    # is sent again) before the rest are cut. A long-poll's wait plus a margin,
    # so a server holds none of this run's requests when the next run starts:
    # a cut connection does not free the thread the server parked for it.
    drain_s: float = 0.0

    @property
    def rule(self) -> str:
        """The rule the bare app registers for the held request."""
        return _rule_of(self.request.path, self.bare_rule)

    def prepare(self, gateway: Gateway) -> Request:
        """The request to hold, after this hold's setup if it has one."""
        return self.setup(gateway, self.request) if self.setup else self.request


@dataclass(frozen=True, slots=True)
class Scenario:
    """One request to measure, and the bare app's equivalent answer to it."""

    name: str
    description: str
    request: Request
    bare_view: View
    expected_status: int = 200
    setup: Setup | None = None
    # The Flask rule the bare app answers on, for a path only known after
    # setup (an id the gateway made): e.g. "/e/<elicitation_id>".
    bare_rule: str | None = None
    hold: Hold | None = None
    # False for demonstrations and slow scenarios: they run only when named.
    in_default_run: bool = True
    # For a request with ``paths`` that each take effect once (a submit): after
    # the last run, how many of them the gateway has used up, counted on the
    # gateway. The runner checks it against the answers wrk counted.
    consumed: Callable[[Gateway], int] | None = None
    # The database statements the gateway makes for this request, in order,
    # each "read" or "write" (see floor.py); none for a request without any.
    floor: tuple[str, ...] = ()

    @property
    def rule(self) -> str:
        """The rule the bare app registers for this scenario."""
        return _rule_of(self.request.path, self.bare_rule)

    def prepare(self, gateway: Gateway) -> Request:
        """The request to send, after this scenario's setup if it has one."""
        return self.setup(gateway, self.request) if self.setup else self.request


SCENARIOS: dict[str, Scenario] = {}


def register(scenario: Scenario) -> Scenario:
    """Add a scenario to the registry; names are unique."""
    if scenario.name in SCENARIOS:
        raise ValueError(f"scenario {scenario.name!r} is registered twice")
    SCENARIOS[scenario.name] = scenario
    return scenario


def long_poll(view: View, parameter: str = "wait", limit: float = 60.0) -> View:
    """A bare view that first sleeps as long as the query asks (``?wait=30``).

    The bare equivalent of a long-poll that nothing completes early: the
    request parks a worker thread for the whole wait, as the gateway's does.
    Without the parameter it answers at once, so one rule serves both the
    measured request and the held one.
    """

    def sleeping(**variables: Any) -> ResponseReturnValue:
        wait = request.args.get(parameter, type=float) or 0.0
        time.sleep(min(max(wait, 0.0), limit))
        return view(**variables)

    sleeping.__name__ = f"long_poll_{getattr(view, '__name__', 'view')}"
    return sleeping


# --- the scenarios -------------------------------------------------------------


def _healthz_bare() -> Response:
    """The gateway's /healthz answer, without the gateway."""
    return jsonify(status="ok")


register(Scenario(
    name="healthz",
    description="GET /healthz: no database, no template; the fixed cost of the gateway's "
                "request hooks and security headers on top of Flask and gunicorn",
    request=Request("GET", "/healthz"),
    bare_view=_healthz_bare,
))

# A demonstration of held requests until the API has a long-poll to hold: /healthz
# answers at once, so the held connections are a busy background load here, not
# parked requests. Run it by name: --scenario healthz-held.
register(Scenario(
    name="healthz-held",
    description="GET /healthz while 32 more connections send GET /healthz back to back",
    request=Request("GET", "/healthz"),
    bare_view=_healthz_bare,
    hold=Hold(request=Request("GET", "/healthz"), count=32, bare_view=_healthz_bare),
    in_default_run=False,
))


# --- the elicitation API ---------------------------------------------------------
#
# Both scenarios hold 500 long-polls (GET /api/v1/elicitations/{id}?wait=60 of
# a pending elicitation nothing completes) on each target while wrk measures,
# as a busy gateway serves its MCP servers' waits beside their other calls.
# The longest wait the API allows: held requests all sent at once also end
# at once, and with thousands held (--hold 10000) that crowd of answers and
# new requests must not fall into the measured seconds.

ELICITATIONS = "/api/v1/elicitations"
ISSUER = "https://auth.example.com"
MESSAGE = "Connect your Example API key so the assistant can read your projects."
HELD_COUNT = 500
HELD_WAIT_S = 60
# Elicitations read or waited on live the longest a client may ask (24 h),
# so a long run never sees them expire.
LONG_TTL_S = 24 * 3600


def _create_body(message: str = MESSAGE, **extra: Any) -> dict[str, Any]:
    """A create request; ``reuse_pending`` off, so each one really creates a row."""
    return {"subject": {"iss": ISSUER, "sub": "bench-user"}, "kind": "api_key",
            "credential_type": "generic", "message": message, "reuse_pending": False,
            **extra}


def _api_token(gateway: Gateway, name: str, webhook_url: str | None = None) -> str:
    """A new API client's bearer token (``gateway clients create NAME --json``).

    With ``webhook_url``, the client has one, so that completing one of its
    elicitations puts an event in the outbox. The URL is on loopback, which
    the outbound guard refuses unless told otherwise: allowed for this command
    only. The bench runs no ``gateway worker``, so nothing is ever sent there.
    """
    return _new_client(gateway, name, webhook_url)[1]


def _new_client(gateway: Gateway, name: str, webhook_url: str | None = None) -> tuple[str, str]:
    """A new API client (``gateway clients create NAME --json``): its id and bearer token."""
    webhook = ("--webhook-url", webhook_url) if webhook_url else ()
    allow = {"GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": urlsplit(webhook_url).netloc} \
        if webhook_url else None
    output = gateway.cli("clients", "create", name, *webhook, "--json", extra_environ=allow)
    try:
        minted = json.loads(output)
        client_id, token = minted["client_id"], minted["api_token"]
    except (ValueError, KeyError, TypeError):
        raise SetupError(f"`gateway clients create {name} --json` printed no api_token") \
            from None
    if not isinstance(client_id, str) or not isinstance(token, str):
        raise SetupError(f"`gateway clients create {name} --json` printed no api_token")
    return client_id, token


def _pending_elicitation(gateway: Gateway, token: str, message: str) -> str:
    """The id of a new pending elicitation, created through the API with ``token``."""
    status, body = gateway.send(Request.with_json(
        "POST", ELICITATIONS, _create_body(message, ttl_seconds=LONG_TTL_S),
        headers={"Authorization": f"Bearer {token}"}))
    if status != 201:
        raise SetupError(f"creating an elicitation answered {status}: {body[:120]!r}")
    elicitation_id = json.loads(body).get("id")
    if not isinstance(elicitation_id, str):
        raise SetupError("creating an elicitation answered no id")
    return elicitation_id


def _create_setup(gateway: Gateway, request: Request) -> Request:
    return request.with_header("Authorization", f"Bearer {_api_token(gateway, 'bench-create')}")


def _read_setup(gateway: Gateway, request: Request) -> Request:
    token = _api_token(gateway, "bench-read")
    elicitation_id = _pending_elicitation(gateway, token, MESSAGE)
    return dataclasses.replace(request, path=f"{ELICITATIONS}/{elicitation_id}") \
        .with_header("Authorization", f"Bearer {token}")


def _held_setup(client_name: str) -> Setup:
    """Setup for the held long-polls: their own client and pending elicitation."""

    def setup(gateway: Gateway, request: Request) -> Request:
        token = _api_token(gateway, client_name)
        elicitation_id = _pending_elicitation(gateway, token, MESSAGE)
        return dataclasses.replace(
            request, path=f"{ELICITATIONS}/{elicitation_id}?wait={HELD_WAIT_S}",
        ).with_header("Authorization", f"Bearer {token}")

    return setup


def _timestamp(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _elicitation_json(elicitation_id: str, subject: Any, message: Any,
                      ttl_seconds: int) -> dict[str, Any]:
    """The gateway's JSON view of a pending api_key elicitation: same fields, same order."""
    now = datetime.now(UTC)
    url = f"https://{request.host}/e/{elicitation_id}"
    return {
        "id": elicitation_id, "url": url, "status": "pending", "kind": "api_key",
        "credential_type": "generic", "payment": None, "subject": subject,
        "message": message, "metadata": {}, "created_at": _timestamp(now),
        "expires_at": _timestamp(now + timedelta(seconds=ttl_seconds)),
        "opened_at": None, "ended_at": None,
        "mcp": {"mode": "url", "message": message, "url": url,
                "elicitationId": elicitation_id},
    }


def _create_bare() -> ResponseReturnValue:
    """201 with the created elicitation, as the gateway answers: the body parsed, an id made."""
    body = request.get_json()
    elicitation_id = "el_" + secrets.token_urlsafe(18)
    response = jsonify(_elicitation_json(elicitation_id, body["subject"], body["message"],
                                         body.get("ttl_seconds", 900)))
    response.headers["Location"] = f"{request.path}/{elicitation_id}"
    return response, 201


def _elicitation_bare(elicitation_id: str) -> Response:
    """The elicitation's JSON, as the gateway answers a read."""
    return jsonify(_elicitation_json(elicitation_id, {"iss": ISSUER, "sub": "bench-user"},
                                     MESSAGE, LONG_TTL_S))


# One view for the read and every held long-poll (one rule): answers at once
# without ?wait, sleeps the wait with it, as nothing completes the elicitation.
_read_bare = long_poll(_elicitation_bare, limit=60)
_ELICITATION_RULE = f"{ELICITATIONS}/<elicitation_id>"


def _held_long_polls(client_name: str) -> Hold:
    return Hold(request=Request("GET", f"{ELICITATIONS}/{{id}}?wait={HELD_WAIT_S}"),
                count=HELD_COUNT, bare_view=_read_bare, setup=_held_setup(client_name),
                bare_rule=_ELICITATION_RULE, settle_s=5.0, drain_s=HELD_WAIT_S + 15.0)


register(Scenario(
    name="create",
    description="POST /api/v1/elicitations: token check, body validation, one INSERT of "
                "the elicitation and its audit row in one transaction; while 500 "
                "long-polls (?wait=30) are held",
    request=Request.with_json("POST", ELICITATIONS, _create_body()),
    bare_view=_create_bare,
    expected_status=201,
    setup=_create_setup,
    hold=_held_long_polls("bench-create-held"),
    # The token's look-up; the elicitation with its audit row, one statement.
    floor=("read", "write"),
))

register(Scenario(
    name="read",
    description="GET /api/v1/elicitations/{id}: token check and one read by primary key; "
                "while 500 long-polls (?wait=30) are held",
    request=Request("GET", f"{ELICITATIONS}/{{id}}"),
    bare_view=_read_bare,
    setup=_read_setup,
    bare_rule=_ELICITATION_RULE,
    hold=_held_long_polls("bench-read-held"),
    # The token's look-up, which reads the elicitation in the same statement.
    floor=("read",),
))


# --- the portal page and keys --------------------------------------------------
#
# A user of the gateway's own accounts, logged in through the real pages, as a
# browser would: the session cookie and a CSRF token from a page of that
# session. The token is bound to the session, not to a page or an
# elicitation, so one token serves every form the session sends.

CREDENTIALS = "/api/v1/credentials"
SESSION_COOKIE = "__Host-gateway_session"
# The key every submit stores: a generic key, so nothing is checked with an
# outside service (the catalog's "generic" type has no live check).
SECRET = "bench-" + "k" * 40
# Pending elicitations made for `submit`, one per measured request: enough for
# the default load (the check, 2 s warm-up and 2 rounds of 10 s on the
# gateway) with room to spare at the submit rates bench/HISTORY.md records. A
# run that needs more fails the scenario rather than measure submits to
# completed elicitations: raise it for longer runs.
SUBMIT_POOL = 30_000
# API clients the pool is spread over, in turn along the paths. A user's key
# for one client and type has one owner, and an owner's captures take turns
# on purpose: the newer one supersedes the older (on PostgreSQL, of two at
# once the second is refused by the index of live keys and runs again).
# Real load spreads over many users and apps; one owner for every submit
# would measure those reruns instead. With 16 owners, a few submits on
# PostgreSQL kept meeting another of their owner's committing first and were
# answered 409 ("submit it again"); with 32, about one submit per owner runs
# at once (bench/HISTORY.md).
SUBMIT_CLIENTS = 32
# The submit client's webhook: an event per completion goes to the outbox, as
# for any client with a webhook; nothing delivers it during the bench.
WEBHOOK_URL = "http://127.0.0.1:9/bench-webhook"
# Connections creating the pool in parallel, each keeping its connection alive.
POOL_CONNECTIONS = 8
_CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')


def _https(gateway: Gateway) -> http.client.HTTPSConnection:
    """A connection to the gateway, verified against its certificate, kept alive."""
    context = ssl.create_default_context(cafile=str(gateway.cafile))
    return http.client.HTTPSConnection(gateway.host, gateway.port, timeout=30, context=context)


def _exchange(connection: http.client.HTTPSConnection, request: Request,
              ) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request on a kept-alive connection: status, headers and body."""
    connection.request(request.method, request.path, body=request.body,
                       headers=dict(request.headers))
    response = connection.getresponse()
    return response.status, response.headers, response.read()


class _Browser:
    """The browser's side of the portal: one connection and the session cookie."""

    def __init__(self, gateway: Gateway) -> None:
        self._connection = _https(gateway)
        self.cookie: str | None = None

    def close(self) -> None:
        self._connection.close()

    def request(self, method: str, path: str,
                form: Mapping[str, str] | None = None) -> tuple[int, str]:
        """Send as a browser would, keep the cookie it sets; the status and page."""
        headers = {"Cookie": f"{SESSION_COOKIE}={self.cookie}"} if self.cookie else {}
        body = None
        if form is not None:
            body = urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        status, response_headers, page = _exchange(
            self._connection, Request(method, path, headers=headers, body=body))
        for cookie in response_headers.get_all("Set-Cookie") or []:
            name, _, rest = cookie.partition("=")
            if name.strip() == SESSION_COOKIE:
                self.cookie = rest.partition(";")[0] or None
        return status, page.decode(errors="replace")

    def csrf_token(self, path: str) -> str:
        """The CSRF token of the form on the page at ``path``."""
        status, page = self.request("GET", path)
        found = _CSRF_FIELD.search(page)
        if status != 200 or not found:
            raise SetupError(f"GET {path} answered {status} without a CSRF token")
        return found.group(1)

    def log_in(self, username: str, password: str, next_path: str) -> None:
        """The login form filled in and sent; the session is then the user's."""
        token = self.csrf_token(f"/login?next={quote(next_path)}")
        status, page = self.request("POST", "/login", {
            "csrf_token": token, "username": username, "password": password,
            "next": next_path})
        if status != 303 or not self.cookie:
            raise SetupError(f"logging in as {username} answered {status}: {page[:120]!r}")


def _local_user(gateway: Gateway, username: str) -> tuple[str, dict[str, str]]:
    """A new local account: its password and its subject (this gateway's URL, the name)."""
    password = secrets.token_urlsafe(18)
    output = gateway.cli("users", "create", username, "--password-stdin", "--json",
                         stdin=password + "\n")
    try:
        subject = json.loads(output)["subject"]
    except (ValueError, KeyError, TypeError):
        raise SetupError(f"`gateway users create {username} --json` printed no subject") \
            from None
    return password, {"iss": str(subject["iss"]), "sub": str(subject["sub"])}


def _create_pending(connection: http.client.HTTPSConnection, token: str,
                    subject: Mapping[str, str], count: int) -> list[str]:
    """``count`` new pending elicitations for ``subject``, through the API; their ids."""
    create = Request.with_json(
        "POST", ELICITATIONS,
        {**_create_body(ttl_seconds=LONG_TTL_S), "subject": dict(subject)},
        headers={"Authorization": f"Bearer {token}"})
    ids = []
    for _ in range(count):
        status, _headers, body = _exchange(connection, create)
        if status != 201:
            raise SetupError(f"creating an elicitation answered {status}: {body[:120]!r}")
        ids.append(json.loads(body)["id"])
    return ids


def _pending_pool(gateway: Gateway, token: str, subject: Mapping[str, str],
                  count: int) -> list[str]:
    """``count`` pending elicitations, made over several connections at once."""
    shares = [count // POOL_CONNECTIONS + (1 if n < count % POOL_CONNECTIONS else 0)
              for n in range(POOL_CONNECTIONS)]

    def make(share: int) -> list[str]:
        connection = _https(gateway)
        try:
            return _create_pending(connection, token, subject, share)
        finally:
            connection.close()

    try:
        with ThreadPoolExecutor(max_workers=POOL_CONNECTIONS) as pool:
            return [i for ids in pool.map(make, shares) for i in ids]
    except (OSError, http.client.HTTPException) as error:
        raise SetupError(f"creating the pool of elicitations failed: {error}") from None


def _submit_form(token: str) -> bytes:
    return urlencode({"csrf_token": token, "action": "submit", "secret": SECRET}).encode()


def _submit_once(browser: _Browser, elicitation_id: str) -> None:
    """The page opened and the key submitted, as the user does it."""
    path = f"/e/{elicitation_id}"
    token = browser.csrf_token(path)
    status, page = browser.request("POST", path, {
        "csrf_token": token, "action": "submit", "secret": SECRET})
    if status != 200 or "complete" not in page:
        raise SetupError(f"submitting a key on {path} answered {status}: {page[:120]!r}")


def _reveal_setup(gateway: Gateway, request: Request) -> Request:
    token = _api_token(gateway, "bench-reveal")
    password, subject = _local_user(gateway, "bench-reveal")
    connection = _https(gateway)
    browser = _Browser(gateway)
    try:
        [elicitation_id] = _create_pending(connection, token, subject, 1)
        browser.log_in(subject["sub"], password, f"/e/{elicitation_id}")
        _submit_once(browser, elicitation_id)
        status, _headers, body = _exchange(connection, Request(
            "GET", CREDENTIALS, headers={"Authorization": f"Bearer {token}"}))
    except (OSError, http.client.HTTPException) as error:
        raise SetupError(f"storing a key to reveal failed: {error}") from None
    finally:
        browser.close()
        connection.close()
    items = json.loads(body).get("items") if status == 200 else None
    if not items:
        raise SetupError(f"GET {CREDENTIALS} answered {status} without the stored key")
    return dataclasses.replace(request, path=f"{CREDENTIALS}/{items[0]['id']}/reveal") \
        .with_header("Authorization", f"Bearer {token}")


def _reveal_bare(credential_id: str) -> Response:
    """The revealed key's JSON, as the gateway answers it."""
    return jsonify(id=credential_id, type="generic", secret=SECRET)


register(Scenario(
    name="reveal",
    description="POST /api/v1/credentials/{id}/reveal: token check, one read, decrypting "
                "the key, one audit row",
    request=Request("POST", f"{CREDENTIALS}/{{id}}/reveal"),
    bare_view=_reveal_bare,
    setup=_reveal_setup,
    bare_rule=f"{CREDENTIALS}/<credential_id>/reveal",
    # The token's look-up, which reads the key in the same statement; the
    # audit row, committed on its own (concurrent reveals share the commit).
    floor=("read", "write"),
))


# An OAuth connection whose access token needs no refresh, stored by
# bench/oauth_connection.py (a process of its own: this module may not import
# the gateway). Its made-up tokens never reach a provider.
OAUTH_SEED = Path(__file__).with_name("oauth_connection.py")


def _reveal_oauth_setup(gateway: Gateway, request: Request) -> Request:
    client_id, token = _new_client(gateway, "bench-reveal-oauth")
    seeded = subprocess.run([sys.executable, str(OAUTH_SEED), client_id, ISSUER, "bench-user"],
                            env=dict(gateway.environ), capture_output=True, text=True,
                            check=False)
    if seeded.returncode != 0:
        last = (seeded.stderr.strip().splitlines() or ["no output"])[-1]
        raise SetupError(f"storing an OAuth connection to reveal failed: {last}")
    return dataclasses.replace(request, path=f"{CREDENTIALS}/{seeded.stdout.strip()}/reveal") \
        .with_header("Authorization", f"Bearer {token}")


register(Scenario(
    name="reveal-oauth",
    description="POST /api/v1/credentials/{id}/reveal of an OAuth connection whose access "
                "token is fresh: as `reveal`, plus the expiry check; no provider is asked",
    request=Request("POST", f"{CREDENTIALS}/{{id}}/reveal"),
    # The bare app has one view per path: `reveal`'s. A connection's answer
    # has four more fields, about 110 bytes the bare one leaves out.
    bare_view=_reveal_bare,
    setup=_reveal_oauth_setup,
    bare_rule=f"{CREDENTIALS}/<credential_id>/reveal",
    # The same statements as `reveal`: a fresh token is handed out in the one
    # transaction that reads the row and writes the audit row.
    floor=("read", "write"),
    in_default_run=False,
))


@dataclass(slots=True)
class _SubmitPool:
    """The `submit` scenario's setup, and the count of what its requests used up."""

    size: int = SUBMIT_POOL
    clients: int = SUBMIT_CLIENTS
    tokens: tuple[str, ...] = ()
    pool: frozenset[str] = frozenset()

    def setup(self, gateway: Gateway, request: Request) -> Request:
        self.tokens = tuple(
            _api_token(gateway, _submit_client(number), webhook_url=WEBHOOK_URL)
            for number in range(self.clients))
        password, subject = _local_user(gateway, "bench-submit")
        browser = _Browser(gateway)
        try:
            browser.log_in(subject["sub"], password, "/logout")
            # The logout page: a form of this session, which changes nothing until sent.
            csrf_token = browser.csrf_token("/logout")
        except (OSError, http.client.HTTPException) as error:
            raise SetupError(f"logging in failed: {error}") from None
        finally:
            browser.close()
        started = time.monotonic()
        share = self.size // len(self.tokens)
        per_client = [_pending_pool(gateway, token, subject, share) for token in self.tokens]
        # Client after client along the paths, so that neighbouring submits
        # (those wrk's connections send at once) belong to different owners.
        ids = [i for turn in zip(*per_client, strict=True) for i in turn]
        print(f"bench: submit: {len(ids):,} pending elicitations of {len(self.tokens)} "
              f"clients made in {time.monotonic() - started:.0f} s", file=sys.stderr,
              flush=True)
        self.pool = frozenset(ids)
        paths = tuple(f"/e/{i}" for i in ids)
        return dataclasses.replace(
            request, path=paths[0], paths=paths, body=_submit_form(csrf_token),
            headers={**request.headers, "Cookie": f"{SESSION_COOKIE}={browser.cookie}"})

    def consumed(self, gateway: Gateway) -> int:
        """How many of the pool's elicitations are completed now (through the API)."""
        if not self.tokens:
            raise SetupError("the pool was never made")
        connection = _https(gateway)
        try:
            return sum(self._completed(connection, token) for token in self.tokens)
        except (OSError, http.client.HTTPException) as error:
            raise SetupError(f"counting completed elicitations failed: {error}") from None
        finally:
            connection.close()

    def _completed(self, connection: http.client.HTTPSConnection, token: str) -> int:
        """How many of the pool's elicitations of one client are completed."""
        completed = 0
        cursor: str | None = None
        while True:
            query = urlencode({"status": "completed", "limit": 100,
                               **({"cursor": cursor} if cursor else {})})
            status, _headers, body = _exchange(connection, Request(
                "GET", f"{ELICITATIONS}?{query}", headers={"Authorization": f"Bearer {token}"}))
            if status != 200:
                raise SetupError(f"listing completed elicitations answered {status}")
            page = json.loads(body)
            completed += sum(1 for item in page["items"] if item["id"] in self.pool)
            cursor = page.get("next_cursor")
            if not cursor:
                return completed


def _submit_client(number: int) -> str:
    """The name of a submit client; all as long as the one the bare app's page names."""
    return f"bench-submit-{number:02d}"


# The gateway's "Done" page, as it answers a submit (its layout, heading,
# notice and the app's name), near enough in size.
_DONE_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <meta name="referrer" content="no-referrer">
  <title>Done · localhost</title>
  <link rel="stylesheet" href="/static/gateway.css?v=0123456789ab">
</head>
<body>
  <header class="site">
    <span class="lock" aria-hidden="true">&#x1F512;</span>
    <span class="host">localhost</span>
  </header>
  <main id="main">
<h1>Done</h1>
<div class="notice ok"><p>This request is complete. Nothing more is needed here.</p></div>
<p>You can go back to bench-submit-00 now.</p>
  </main>
  <footer class="site">
    <p>Never enter a key or card here unless you came from an app you trust,
      and the address bar shows this host.</p>
  </footer>
</body>
</html>
"""


def _submit_bare(elicitation_id: str) -> ResponseReturnValue:
    """The form parsed as the gateway parses it, and a page like its done page."""
    if request.form.get("action") != "submit" or not request.form.get("secret"):
        return "missing form fields", 400
    return _DONE_PAGE


_submit_pool = _SubmitPool()

register(Scenario(
    name="submit",
    description="POST /e/{id} from a logged-in browser session: session and CSRF check, "
                "the key's shape, encrypting and storing it, completing the elicitation "
                "with its audit and outbox rows; each request to another pending one",
    request=Request("POST", "/e/{id}",
                    headers={"Content-Type": "application/x-www-form-urlencoded"}),
    bare_view=_submit_bare,
    setup=_submit_pool.setup,
    bare_rule="/e/<elicitation_id>",
    consumed=_submit_pool.consumed,
    # The browser session; the elicitation; the change (key, elicitation,
    # audit and outbox rows), one statement.
    floor=("read", "read", "write"),
))
