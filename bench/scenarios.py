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
import ssl
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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


View = Callable[[], ResponseReturnValue]
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

    def sleeping() -> ResponseReturnValue:
        wait = request.args.get(parameter, type=float) or 0.0
        time.sleep(min(max(wait, 0.0), limit))
        return view()

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
