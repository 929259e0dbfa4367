"""docs/deployment: the nginx configuration and systemd units agree with the gateway they run.

tests/integration/nginx runs the nginx configuration itself; these tests
pin what it and the units promise about the code: the same body limit,
longer patience than the longest long-poll, commands and options that exist.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from gateway.app import MAX_REQUEST_BYTES
from gateway.cli import main
from gateway.elicitations.api import MAX_WAIT_SECONDS

pytestmark = pytest.mark.backend_independent

DEPLOYMENT = Path(__file__).resolve().parents[2] / "docs" / "deployment"
NGINX_CONF = DEPLOYMENT / "nginx.conf"
WEB_UNIT = DEPLOYMENT / "gateway-web.service"
WORKER_UNIT = DEPLOYMENT / "gateway-worker.service"
INSTALLED_GATEWAY = "/opt/gateway/bin/gateway"
INSTANCE_PATH = "/var/lib/gateway"


def nginx_directive(name: str) -> list[str]:
    """The values of every ``name …;`` line of the documented nginx configuration."""
    pattern = rf"^[ \t]*{re.escape(name)}[ \t]+([^;{{\n]*);"
    return re.findall(pattern, NGINX_CONF.read_text(), flags=re.MULTILINE)


def nginx_size(value: str) -> int:
    units = {"": 1, "k": 1024, "m": 1024 * 1024}
    number, unit = re.fullmatch(r"(\d+)([kKmM]?)", value).groups()  # type: ignore[union-attr]
    return int(number) * units[unit.lower()]


def nginx_seconds(value: str) -> int:
    return int(value.removesuffix("s"))


def unit_settings(path: Path) -> dict[str, list[str]]:
    """Every ``Key=value`` of a systemd unit, the values of repeated keys in order."""
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def gateway_command(unit: dict[str, list[str]]) -> tuple[str, dict[str, Any]]:
    """The ``gateway`` subcommand a unit starts and its options, parsed as the CLI parses them."""
    [exec_start] = unit["ExecStart"]
    program, name, *args = shlex.split(exec_start)
    assert program == INSTALLED_GATEWAY
    command = main.get_command(click.Context(main), name)
    assert command is not None, f"`gateway {name}` does not exist"
    return name, command.make_context(name, args).params


def test_nginx_lets_through_every_body_the_gateway_accepts_and_no_larger() -> None:
    [limit] = nginx_directive("client_max_body_size")
    assert nginx_size(limit) == MAX_REQUEST_BYTES
    [buffer] = nginx_directive("client_body_buffer_size")
    assert nginx_size(buffer) >= MAX_REQUEST_BYTES  # kept in memory, never in a file


def test_nginx_waits_longer_than_the_longest_long_poll() -> None:
    [read_timeout] = nginx_directive("proxy_read_timeout")
    assert nginx_seconds(read_timeout) >= MAX_WAIT_SECONDS + 10


def test_nginx_sets_every_forwarded_header_the_gateway_trusts() -> None:
    set_headers = dict(value.split(None, 1) for value in nginx_directive("proxy_set_header"))
    assert set_headers["X-Forwarded-For"] == "$proxy_add_x_forwarded_for"
    assert set_headers["X-Forwarded-Proto"] == "$scheme"
    assert set_headers["X-Forwarded-Host"] == "$host"
    assert set_headers["X-Forwarded-Port"] == "$server_port"


def test_the_web_unit_serves_nginx_plain_http_on_loopback_trusting_one_hop() -> None:
    unit = unit_settings(WEB_UNIT)
    name, options = gateway_command(unit)
    assert name == "serve"
    assert options["no_worker"]
    assert options["no_tls"]
    assert options["host"] == "127.0.0.1"
    assert nginx_directive("server") == [f"127.0.0.1:{options['port']}"]
    assert "GATEWAY_PROXY_HOPS=1" in unit["Environment"]


def test_the_worker_unit_runs_the_worker() -> None:
    name, options = gateway_command(unit_settings(WORKER_UNIT))
    assert name == "worker"
    assert options == {"once": False, "parent": None}


@pytest.mark.parametrize("path", [WEB_UNIT, WORKER_UNIT], ids=lambda path: path.stem)
def test_the_units_read_the_shared_settings_and_may_write_only_the_instance_folder(
    path: Path,
) -> None:
    unit = unit_settings(path)
    assert unit["EnvironmentFile"] == ["/etc/gateway/gateway.env"]
    assert f"GATEWAY_INSTANCE_PATH={INSTANCE_PATH}" in unit["Environment"]
    assert unit["ReadWritePaths"] == [INSTANCE_PATH]
    assert unit["ProtectSystem"] == ["strict"]
    assert unit["NoNewPrivileges"] == ["yes"]
    assert unit["CapabilityBoundingSet"] == [""]
    assert unit["User"] == ["gateway"]


ENV_FILE_MODE = re.compile(r"gateway\.env`?[ ,(]+(?:root:\w+, )?mode (0[0-7]{3})(?:, (root:\w+))?")


@pytest.mark.parametrize("path", [WEB_UNIT, DEPLOYMENT / "README.md",
                                  DEPLOYMENT.parent / "deployment.md"],
                         ids=lambda path: path.name)
def test_every_document_gives_the_environment_file_the_same_mode(path: Path) -> None:
    # systemd reads the EnvironmentFile as root, before it drops to `gateway`:
    # no group needs to read the secrets in it.
    text = " ".join(path.read_text().split())
    modes = ENV_FILE_MODE.findall(text)
    assert modes, f"{path.name} does not say the environment file's mode"
    assert {mode for mode, _ in modes} == {"0600"}
    assert "root:gateway" not in text


@pytest.mark.parametrize("path", [WEB_UNIT, WORKER_UNIT], ids=lambda path: path.stem)
def test_systemd_accepts_the_units(path: Path, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is missing: systemd's own check of the units needs it")
    # It checks that ExecStart's program exists: this run's gateway stands in.
    gateway = Path(sys.executable).parent / "gateway"
    copy = tmp_path / path.name
    copy.write_text(path.read_text().replace(INSTALLED_GATEWAY, str(gateway)))
    checked = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True,
                             timeout=60, check=False)
    assert checked.returncode == 0, checked.stderr
    assert checked.stderr == ""
