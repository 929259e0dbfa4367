"""``gateway init``: a new instance folder with fresh random secrets."""

from __future__ import annotations

import base64
import os
import secrets
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
