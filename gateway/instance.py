"""``gateway init``: a new instance folder with fresh random secrets."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import tomllib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import click

from gateway import cli
from gateway.files import FileError, write_private_files
from gateway.settings import CONFIG_ENV, SettingsError, check_public_url, env_name

KEYRING_NAME = "keyring"


def instance_path_from_environment() -> Path:
    """The instance folder before settings can be loaded (they may not exist yet)."""
    return Path(os.environ.get(env_name("instance_path"), "instance"))


def config_text(public_url: str, extra_hosts: tuple[str, ...]) -> str:
    """A config file with fresh secrets; everything else keeps its default."""
    hosts = ", ".join(f'"{host}"' for host in extra_hosts)
    return (
        f"# Written by `gateway init` on {datetime.now(UTC):%Y-%m-%d}.\n"
        "# Every setting is described in gateway.example.toml, shipped in the\n"
        "# package's config folder. Keep this file private (mode 0600).\n\n"
        f'public_url = "{public_url}"\n'
        f"allowed_hosts = [{hosts}]\n\n"
        "# Signs CSRF tokens. Changing it logs nobody out but voids open forms.\n"
        f'secret_key = "{secrets.token_urlsafe(48)}"\n'
        "# Keys the digests of API tokens and session ids. Changing it revokes\n"
        "# every API token and ends every session.\n"
        f'token_pepper = "{secrets.token_urlsafe(48)}"\n'
    )


def keyring_text() -> str:
    """A keyring with one fresh 256-bit key-encryption key, version 1."""
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    return (
        "# Key-encryption keys, newest first, as version:base64. Keep this file\n"
        "# private (mode 0600) and backed up apart from the database.\n"
        f"v1:{key}\n"
    )


def config_path() -> Path:
    """Where the config file is (GATEWAY_CONFIG, else in the instance folder)."""
    if CONFIG_ENV in os.environ:
        return Path(os.environ[CONFIG_ENV])
    return instance_path_from_environment() / "gateway.toml"


def create_instance(public_url: str) -> list[Path]:
    """Write a config with fresh secrets and a keyring; the files written.

    Raises SettingsError for a bad URL and FileError when a file exists or
    cannot be written (then nothing is left behind).
    """
    public_url = check_public_url(public_url)
    instance = instance_path_from_environment()
    local = public_url.startswith(("https://localhost", "https://127.0.0.1"))
    files = {
        config_path(): config_text(public_url, ("127.0.0.1",) if local else ()).encode(),
        instance / KEYRING_NAME: keyring_text().encode(),
    }
    write_private_files(files)
    instance.chmod(0o700)
    return list(files)


def set_config_values(values: Mapping[str, str | tuple[str, ...]]) -> Path:
    """Set these top-level settings in the config file, keeping every other line; its path.

    For a command that keeps settings of its own in the instance (the demo),
    so that every other command run there reads the same ones. The file is
    replaced whole, owner-only, and read back before it is: a value that
    does not come back as written leaves the old file in place.
    """
    path = config_path()
    lines = path.read_text(encoding="utf-8").splitlines()
    for key, value in values.items():
        line = f"{key} = {_toml_value(value)}"
        pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
        at = next((i for i, text in enumerate(lines) if pattern.match(text)), None)
        if at is None:
            lines.append(line)
        else:
            lines[at] = line
    text = "\n".join(lines) + "\n"
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        document = {}
    if any(document.get(key) != (list(v) if isinstance(v, tuple) else v)
           for key, v in values.items()):
        raise FileError(f"cannot set {', '.join(values)} in {path}: a value spans several lines")
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.unlink(missing_ok=True)
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(scratch, path)
    return path


def _toml_value(value: str | tuple[str, ...]) -> str:
    # A JSON string is a TOML basic string: the same quotes and escapes.
    if isinstance(value, str):
        return json.dumps(value)
    return "[" + ", ".join(json.dumps(item) for item in value) + "]"


@click.command()
@click.option("--public-url", default="https://localhost:8443", show_default=True,
              help="The https origin users reach.")
def init(public_url: str) -> None:
    """Create the instance folder, its config and keyring, with fresh secrets."""
    try:
        written = create_instance(public_url)
    except SettingsError as error:
        cli.fail(str(error).replace(env_name("public_url"), "--public-url"))
    except FileError as error:
        cli.fail(str(error))
    for path in written:
        click.echo(f"wrote {path} (mode 0600)")
    click.echo("next: gateway db upgrade && gateway serve")
