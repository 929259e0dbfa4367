"""Fixtures that run the real ``gateway`` command in a scratch instance."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

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

    def start(*args: str, env: dict[str, str] | None = None, tls: bool = True) -> Server:
        port = free_port()
        log = tmp_path / f"serve-{port}.log"
        with log.open("w") as handle:
            process = subprocess.Popen(
                [*GATEWAY, "serve", "--port", str(port), "--workers", "1", "--threads", "4",
                 *args],
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
