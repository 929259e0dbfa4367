"""Fixtures that run ``gateway`` commands in a scratch instance: in this process through
Click's runner (``invoke_gateway``), or as a real process (``run_gateway``, ``start_server``)
where the process itself is under test.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Connection, Engine, event

from gateway.cli import main
from tests.conftest import process_environ

GATEWAY = [sys.executable, "-m", "gateway"]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


@pytest.fixture
def cli_environ(base_environ: dict[str, str]) -> dict[str, str]:
    """The process environment for gateway commands: no stray GATEWAY_* from outside."""
    return process_environ({**base_environ, "GATEWAY_PUBLIC_URL": "https://localhost:8443"})


@pytest.fixture
def run_gateway(cli_environ: dict[str, str], tmp_path: Path) -> Callable[..., Result]:
    """Run a gateway command to completion."""

    def run(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> Result:
        completed = subprocess.run(
            [*GATEWAY, *args], env=env or cli_environ, cwd=tmp_path, input=stdin,
            capture_output=True, text=True, timeout=120, check=False,
        )
        return Result(completed.returncode, completed.stdout, completed.stderr)

    return run


@pytest.fixture
def cli_state() -> Iterator[None]:
    """Put back what a command run in this process leaves behind.

    Commands configure logging (a root handler writing to the runner's captured
    stderr, logger levels), may set environment variables (the demo, the
    metrics folder) and signal handlers (the worker).
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logger.level for name, logger in logging.root.manager.loggerDict.items()
              if isinstance(logger, logging.Logger)}
    environ = dict(os.environ)
    handlers_of = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
        with contextlib.suppress(OSError, ValueError):
            handler.close()
    root.setLevel(level)
    for name, logger in logging.root.manager.loggerDict.items():
        if isinstance(logger, logging.Logger):
            logger.setLevel(levels.get(name, logging.NOTSET))
    os.environ.clear()
    os.environ.update(environ)
    for number, handler in handlers_of.items():
        signal.signal(number, handler)


@pytest.fixture
def cli_runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def invoke_gateway(cli_runner: CliRunner, cli_environ: dict[str, str], tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch, cli_state: None) -> Callable[..., Result]:
    """Run a gateway command to completion in this process, with the environment it would
    have as a process of its own (exactly ``env``, or ``cli_environ``) and ``tmp_path`` as its
    working directory. Engines the command leaves open are disposed of afterwards.
    """
    monkeypatch.chdir(tmp_path)

    def invoke(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> Result:
        environ = env or cli_environ
        unset: dict[str, str | None] = {name: None for name in os.environ if name not in environ}
        engines: set[Engine] = set()

        def connected(connection: Connection) -> None:
            engines.add(connection.engine)

        event.listen(Engine, "engine_connect", connected)
        try:
            result = cli_runner.invoke(main, list(args), env={**unset, **environ}, input=stdin,
                                       catch_exceptions=False)
        finally:
            event.remove(Engine, "engine_connect", connected)
            for engine in engines:
                engine.dispose()
        return Result(result.exit_code, result.stdout, result.stderr)

    return invoke


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Server:
    process: subprocess.Popen[str]
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text()


@pytest.fixture
def start_server(cli_environ: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Start ``gateway serve`` and wait until it accepts connections; stop it afterwards."""
    servers: list[Server] = []

    def start(*args: str, env: dict[str, str] | None = None, tls: bool = True,
              workers: str | None = "1") -> Server:
        # One worker unless asked: the tests that need more say so. None
        # leaves serve's own default (one per CPU).
        port = free_port()
        log = tmp_path / f"serve-{port}.log"
        sized = ["--workers", workers] if workers else []
        with log.open("w") as handle:
            process = subprocess.Popen(
                [*GATEWAY, "serve", "--port", str(port), *sized, "--waits", "100", *args],
                env=env or cli_environ, cwd=tmp_path, stdout=handle,
                stderr=subprocess.STDOUT, text=True,
            )
        server = Server(process, port, log)
        servers.append(server)
        _wait_until_listening(server)
        return server

    yield start
    for server in servers:
        server.process.terminate()
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


def _wait_until_listening(server: Server, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"gateway serve exited early:\n{server.output()}")
        if "Booting worker" in server.output():
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
                return
            except OSError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"gateway serve did not start:\n{server.output()}")


def tls_context(certfile: Path) -> ssl.SSLContext:
    """A client context that trusts exactly this certificate."""
    return ssl.create_default_context(cafile=str(certfile))
