"""The two targets: a scratch gateway instance and the bare app, each its own gunicorn.

Everything here is made for one run and undone afterwards, whatever happens:
the instance folder, a PostgreSQL scratch database, both server processes.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from floor import ENVIRONMENT as FLOOR_ENVIRONMENT
from scenarios import Gateway, Request, send
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from gateway.serving.affinity import PRE_FORK
from gateway.serving.server import Options, gunicorn_config
from gateway.serving.tls import dev_certificate_paths
from gateway.settings import ENV_PREFIX, SettingsError, load_settings

HOST = "127.0.0.1"
GATEWAY_COMMAND = (sys.executable, "-m", "gateway")
BARE_SCRIPT = Path(__file__).with_name("bare.py")
# The same server the test suite uses, and the same variable to point elsewhere.
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# The limiter stays on (its cost per request is part of what is measured), with
# limits no load here can reach, so that no request is refused with 429.
UNREACHABLE_LIMIT = "100000000/minute"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


class BenchSetupError(Exception):
    """A target could not be prepared or started; the message says which and why.

    ``detail`` holds what helps to dig further (the end of a server's output);
    the message itself stays one line.
    """

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Server:
    """One running gunicorn, its port and the file its output goes to."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def last_lines(self, count: int = 15) -> str:
        """The end of its output, to show why it failed."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no output)"
        return "\n".join(lines[-count:]) or "(no output)"


def free_port(*besides: int) -> int:
    """A port nothing listens on right now (and none of ``besides``, taken but not yet bound)."""
    while True:
        with socket.socket() as probe:
            probe.bind((HOST, 0))
            port: int = probe.getsockname()[1]
        if port not in besides:
            return port


# --- the database -------------------------------------------------------------


def describe_database(url: str | None) -> str:
    """The database for the header, without its password."""
    return "sqlite" if url is None else make_url(url).render_as_string(hide_password=True)


@contextmanager
def scratch_database(kind: str) -> Iterator[str | None]:
    """A new, empty database URL, dropped afterwards; None for SQLite in the instance."""
    if kind == "sqlite":
        yield None
        return
    server_url = os.environ.get("TEST_DATABASE_URL") or DEFAULT_POSTGRES_URL
    name = f"gateway_bench_{secrets.token_hex(6)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError as error:
        admin.dispose()
        raise BenchSetupError(f"cannot create a scratch database on "
                              f"{describe_database(server_url)} ({type(error).__name__}); "
                              "is PostgreSQL running? set TEST_DATABASE_URL") from None
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        try:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        except SQLAlchemyError as error:
            print(f"bench: could not drop the scratch database {name} "
                  f"({type(error).__name__}); drop it by hand", file=sys.stderr)
        finally:
            admin.dispose()


# --- the gateway --------------------------------------------------------------


def scratch_environ(instance: Path, port: int, database_url: str | None) -> dict[str, str]:
    """The gateway's environment: this instance only, no GATEWAY_* from outside."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    environ["GATEWAY_INSTANCE_PATH"] = str(instance)
    # init allows 127.0.0.1 as a host for a localhost URL; the load goes there.
    environ["GATEWAY_PUBLIC_URL"] = f"https://localhost:{port}"
    environ["GATEWAY_RATELIMIT_API"] = UNREACHABLE_LIMIT
    environ["GATEWAY_RATELIMIT_API_IP"] = UNREACHABLE_LIMIT
    if database_url:
        environ["GATEWAY_DATABASE_URL"] = database_url
    return environ


def init_instance(environ: dict[str, str], folder: Path) -> None:
    """``gateway init`` and ``gateway db upgrade`` in the scratch instance."""
    for args in (("init",), ("db", "upgrade")):
        result = subprocess.run([*GATEWAY_COMMAND, *args], env=environ, cwd=folder,
                                capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise BenchSetupError(f"`gateway {' '.join(args)}` exited {result.returncode}: "
                                  f"{last}")


@contextmanager
def run_gateway(environ: dict[str, str], folder: Path, options: Options) -> Iterator[Gateway]:
    """``gateway serve`` with these options, answering /healthz over TLS; stopped afterwards."""
    # No worker beside it: the bare app has none, and webhook sending is
    # measured on its own by bench/webhooks.py.
    # API limits in memory, one set per worker: the limits are set out of
    # reach (scratch_environ), so counting apart changes nothing measured.
    command = (*GATEWAY_COMMAND, "serve", "--host", options.host, "--port", str(options.port),
               "--workers", str(options.workers), "--waits", str(options.waits),
               "--no-worker", *(["--pin-workers"] if options.pin_workers else []))
    certfile, _ = dev_certificate_paths(Path(environ["GATEWAY_INSTANCE_PATH"]))
    with _started("gateway", command, environ, folder, options.port) as server:
        # serve writes the certificate before it binds, so it exists once the port answers.
        _wait_until_answering(server, certfile, Request("GET", "/healthz"), expect=200)
        yield Gateway(host=HOST, port=server.port, instance_path=Path(
            environ["GATEWAY_INSTANCE_PATH"]), environ=environ, command=GATEWAY_COMMAND,
            cafile=certfile)


def gateway_options(port: int, workers: int, waits: int, instance: Path, *,
                    pin_workers: bool = False) -> Options:
    """How ``gateway serve`` will serve: its own development certificate, on loopback."""
    return Options(host=HOST, port=port, workers=workers, waits=waits,
                   tls_files=dev_certificate_paths(instance), pin_workers=pin_workers)


def describe_pinning(config: dict[str, Any]) -> str:
    """How both servers place their workers on CPUs, read from the settings they run."""
    return ", each worker on one CPU" if config.get("pre_fork") == PRE_FORK else \
        ", workers not pinned"


def server_config(environ: dict[str, str], options: Options) -> dict[str, Any]:
    """The gunicorn settings ``gateway serve`` uses for these options, from its own code."""
    try:
        settings = load_settings(environ)
    except SettingsError as error:
        raise BenchSetupError(f"the scratch instance's settings: {error}") from None
    return gunicorn_config(settings, options)


# --- the bare app -------------------------------------------------------------


@contextmanager
def run_bare(config: dict[str, Any], port: int, folder: Path, environ: dict[str, str],
             cafile: Path, *, name: str = "bare", floor: str | None = None) -> Iterator[Server]:
    """The bare app under ``config`` (the gateway's gunicorn settings, bound to ``port``).

    ``floor``: where its views make their scenario's floor statements (see
    :func:`floor_database`); ``name`` tells its files and messages apart.
    """
    config_file = folder / f"{name}-gunicorn.json"
    config_file.write_text(json.dumps(config, indent=2))
    command = (sys.executable, str(BARE_SCRIPT), str(config_file))
    # Set for the floor server only, whatever the runner's own environment holds.
    environ = {key: value for key, value in environ.items() if key != FLOOR_ENVIRONMENT}
    if floor:
        environ[FLOOR_ENVIRONMENT] = floor
    with _started(name, command, environ, folder, port) as server:
        # Any answer will do: the bare app has no health route of its own.
        _wait_until_answering(server, cafile, Request("GET", "/"), expect=None)
        yield server


def floor_database(folder: Path, database_url: str | None) -> str:
    """Where the floor's statements run, as ``bench/floor.py`` takes it.

    The gateway's PostgreSQL database, or a SQLite file of its own beside the
    gateway's instance (same disk, same settings).
    """
    if database_url is None:
        return f"sqlite:{folder / 'floor.db'}"
    # The driver's own form of the URL: the floor uses psycopg, not SQLAlchemy.
    return make_url(database_url).set(drivername="postgresql").render_as_string(
        hide_password=False)


# --- processes ----------------------------------------------------------------


@contextmanager
def _started(name: str, command: tuple[str, ...], environ: dict[str, str], folder: Path,
             port: int) -> Iterator[Server]:
    """A server process with its output in a file; stopped (workers too) afterwards."""
    log = folder / f"{name}.log"
    with log.open("wb") as handle:
        # Its own session: Ctrl-C reaches only the runner, which then stops
        # the servers in order, and a kill can take the workers with the master.
        process = subprocess.Popen(command, env=environ, cwd=folder, stdout=handle,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(name=name, process=process, port=port, log=log)
    try:
        yield server
    finally:
        stop(server)


def stop(server: Server) -> None:
    """Terminate gunicorn (it stops its workers), then kill the group if it lingers."""
    if server.process.poll() is None:
        server.process.terminate()
        with suppress(subprocess.TimeoutExpired):
            server.process.wait(timeout=STOP_TIMEOUT_S)
    # Workers left behind by a master that died or would not stop.
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()


def _wait_until_answering(server: Server, cafile: Path, request: Request,
                          expect: int | None) -> None:
    """Until ``request`` gets an answer over TLS verified against ``cafile``."""
    deadline = time.monotonic() + START_TIMEOUT_S
    problem = "no answer"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise BenchSetupError(f"the {server.name} server exited "
                                  f"{server.process.returncode} while starting",
                                  server.last_lines())
        try:
            status, _ = send(HOST, server.port, request, cafile, timeout=5)
        except (OSError, http.client.HTTPException) as error:  # ssl errors are OSErrors
            problem = f"{type(error).__name__}: {error}"
        else:
            if expect is None or status == expect:
                return
            problem = f"{request.path} answered {status}"
        time.sleep(0.2)
    raise BenchSetupError(f"the {server.name} server did not answer within "
                          f"{START_TIMEOUT_S:.0f} s ({problem})", server.last_lines())
