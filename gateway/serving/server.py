"""Running the app under gunicorn's gevent workers.

A worker is one process with one thread; each connection is a greenlet on
it. A request runs until it waits on the network (PostgreSQL, a provider, the
client), and the worker serves another meanwhile, so a held long-poll costs a
greenlet's memory and a socket, not a thread. Processes, one per CPU, carry
the parallelism; the app holds no per-process state, so any number of
instances can run side by side. docs/performance.md says why gevent rather
than threads or an ASGI front.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

from flask import Flask
from gunicorn.app.base import BaseApplication

from gateway.metrics import counters
from gateway.serving import affinity, forks
from gateway.serving.access_log import GatewayLogger
from gateway.serving.supervisor import Supervisor
from gateway.settings import Settings

# The access log shows the path without its query string: a client that puts
# a token in a query string (refused anyway) must not have it written down.
# The gateway's own GatewayLogger writes these fields (and the request id) in
# the configured log format; gunicorn's stock logger, which the benchmark's
# bare baseline runs with, uses this format string.
ACCESS_LOG_FORMAT = '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(B)s %(M)sms'

# Connections a worker takes beside its held long-polls: ordinary requests
# and idle keep-alive connections.
ORDINARY_CONNECTIONS: Final = 1000
# A command that serves with `gateway serve` beside a thread of its own (the
# demo's receiver) sets this in its click context: the server then runs in a
# child process instead of replacing this one.
IN_CHILD: Final = "gateway.serve_in_child"
# The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG: Final = 4096


@dataclass(frozen=True, slots=True)
class Options:
    """How to serve."""

    host: str
    port: int
    workers: int
    # Long-polls each worker holds at once; past that a wait answers at once.
    waits: int
    tls_files: tuple[Path, Path] | None
    with_worker: bool = False
    # Each worker process on one CPU of its own, when there are as many workers
    # as CPUs or more (see gateway.serving.affinity). Off unless asked: a pinned
    # worker cannot move off a CPU that other busy programs on the host share.
    pin_workers: bool = False

    def to_json(self) -> str:
        """These options as one JSON string (:meth:`from_json` reads it back)."""
        fields = dataclasses.asdict(self)
        if self.tls_files is not None:
            fields["tls_files"] = [str(path) for path in self.tls_files]
        return json.dumps(fields)

    @classmethod
    def from_json(cls, text: str) -> Options:
        """The options :meth:`to_json` wrote."""
        fields = json.loads(text)
        if fields["tls_files"] is not None:
            certfile, keyfile = fields["tls_files"]
            fields["tls_files"] = (Path(certfile), Path(keyfile))
        return cls(**fields)


def gunicorn_config(settings: Settings, options: Options) -> dict[str, Any]:
    """The gunicorn settings for these options."""
    host = f"[{options.host}]" if ":" in options.host else options.host
    config: dict[str, Any] = {
        "bind": [f"{host}:{options.port}"],
        "workers": options.workers,
        "worker_class": "gevent",
        # Held long-polls, and room beside them for everything else.
        "worker_connections": options.waits + ORDINARY_CONNECTIONS,
        # A crowd of clients (re)connecting at once, each with a TLS
        # handshake to do, waits in the kernel's queue rather than be refused.
        "backlog": LISTEN_BACKLOG,
        "proc_name": "gateway",
        "accesslog": "-",
        "access_log_format": ACCESS_LOG_FORMAT,
        "errorlog": "-",
        "loglevel": settings.log_level,
        "keepalive": 5,
        "graceful_timeout": 30,
        # Forwarded headers are trusted only through GATEWAY_PROXY_HOPS, in the
        # app; gunicorn's own defaults would trust them from loopback.
        "forwarded_allow_ips": "",
        "secure_scheme_headers": {},
        # gunicorn 24+ opens a control socket in the home folder; several
        # instances on one host would fight over it, and nothing here uses it.
        "control_socket_disable": True,
        # Each worker listens on a socket of its own (SO_REUSEPORT), and the
        # kernel spreads new connections over them by their addresses. On one
        # shared socket, whichever worker is running when a burst of
        # connections arrives accepts them all, and keeps them, while the
        # other workers idle (bench/HISTORY.md, "Half-speed rounds").
        # `gateway serve` checks first that no other program holds the port.
        "reuse_port": True,
        "post_fork": forks.POST_FORK,
    }
    if options.pin_workers and affinity.pins(options.workers):
        config["pre_fork"] = affinity.PRE_FORK
    if options.with_worker:
        config["on_starting"] = _start_worker
        config["on_exit"] = _stop_worker
    if options.tls_files:
        certfile, keyfile = options.tls_files
        config["certfile"] = str(certfile)
        config["keyfile"] = str(keyfile)
    return config


_supervisors: list[Supervisor] = []


def _start_worker(arbiter: Any) -> None:
    # One `gateway worker` per server, in its own process: webhooks and the
    # sweeper keep running whatever the request workers do, and a worker
    # that dies is started again.
    # --stop-with: should this server be killed outright, its worker stops too.
    supervisor = Supervisor([sys.executable, "-m", "gateway", "worker", "--stop-with",
                             str(os.getpid())])
    _supervisors.append(supervisor)
    supervisor.start()


def _stop_worker(arbiter: Any) -> None:
    for supervisor in _supervisors:
        supervisor.stop()


class GatewayServer(BaseApplication):  # type: ignore[misc]
    """gunicorn, configured in code and loading the gateway app in each worker."""

    def __init__(self, settings: Settings, options: Options) -> None:
        self._settings = settings
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in gunicorn_config(self._settings, self._options).items():
            if key in self.cfg.settings:  # older gunicorn lacks the newest keys
                self.cfg.set(key, value)
        # Set here, not in gunicorn_config: the benchmark's bare baseline runs
        # that config and must not import the gateway.
        self.cfg.set("logger_class", GatewayLogger)

    def load(self) -> Flask:
        from gateway.app import create_app

        return create_app(self._settings, wait_slots=self._options.waits)


def become_server(settings: Settings, options: Options, *, in_child: bool = False) -> NoReturn:
    """Serve with ``options`` in the process of :mod:`gateway.serving.process`; never return.

    This process becomes that one (same process id, same signals), unless
    ``in_child``: then it runs beside it (the demo's webhook receiver lives
    in this process), passes on the signals that stop it and exits as it does.
    """
    # Imported here: the server process imports this module, and must not
    # import the web package (see gateway.serving.process).
    from gateway.web import proxies

    scheme = "https" if options.tls_files else "http"
    log = logging.getLogger("gateway")
    log.info("serving %s on %s://%s:%d", settings.public_url, scheme, options.host, options.port)
    # Which addresses end up in the audit trail depends on it: said at start.
    log.info(proxies.describe(settings))
    for handler in logging.getLogger().handlers:
        handler.flush()  # what this process logged, before its image is replaced
    command = [sys.executable, "-m", "gateway.serving.process", options.to_json()]
    if not in_child:
        os.execv(command[0], command)  # noqa: S606  # the same program, a clean start
    server = subprocess.Popen(command)  # the same program, a fixed command
    for stopping in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stopping, lambda number, _: server.send_signal(number))
    sys.exit(server.wait())


def run(settings: Settings, options: Options) -> None:
    """Serve until stopped (in the process of :mod:`gateway.serving.process`)."""
    with counters.shared_between_processes():
        GatewayServer(settings, options).run()
