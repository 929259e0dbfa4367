"""The benchmark's scenarios: one request each, sent alike to the gateway and the bare app.

A scenario says what wrk sends (method, path, headers, body), what the bare
app answers on that path, and optionally a setup hook that runs once against
the started gateway (to create an API client, say) and returns the request to
send, token included. Both targets then get byte-for-byte the same request.

A scenario may also hold requests open in the background while wrk measures
(``hold``): say 500 long-polls that each wait 30 s, re-issued as each returns,
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
import secrets
import ssl
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from flask import Response, jsonify, request
from flask.typing import ResponseReturnValue


class SetupError(Exception):
    """A scenario's setup could not prepare the gateway; the message says why."""


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request, as wrk sends it on every connection."""

    method: str = "GET"
    path: str = "/"
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None

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

    def cli(self, *args: str) -> str:
        """Run ``gateway ARGS`` against this instance and return what it printed."""
        result = subprocess.run([*self.command, *args], env=dict(self.environ),
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
# Both scenarios hold 500 long-polls (GET /api/v1/elicitations/{id}?wait=30 of
# a pending elicitation nothing completes) on each target while wrk measures,
# as a busy gateway serves its MCP servers' waits beside their other calls.

ELICITATIONS = "/api/v1/elicitations"
ISSUER = "https://auth.example.com"
MESSAGE = "Connect your Example API key so the assistant can read your projects."
HELD_COUNT = 500
HELD_WAIT_S = 30
# Elicitations read or waited on live the longest a client may ask (24 h),
# so a long run never sees them expire.
LONG_TTL_S = 24 * 3600


def _create_body(message: str = MESSAGE, **extra: Any) -> dict[str, Any]:
    """A create request; ``reuse_pending`` off, so each one really creates a row."""
    return {"subject": {"iss": ISSUER, "sub": "bench-user"}, "kind": "api_key",
            "credential_type": "generic", "message": message, "reuse_pending": False,
            **extra}


def _api_token(gateway: Gateway, name: str) -> str:
    """A new API client's bearer token (``gateway clients create NAME --json``)."""
    output = gateway.cli("clients", "create", name, "--json")
    try:
        token = json.loads(output)["api_token"]
    except (ValueError, KeyError, TypeError):
        raise SetupError(f"`gateway clients create {name} --json` printed no api_token") \
            from None
    if not isinstance(token, str):
        raise SetupError(f"`gateway clients create {name} --json` printed no api_token")
    return token


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
))
