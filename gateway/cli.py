"""The ``gateway`` command group. Each feature registers its own commands.

Every command fails the same way: one line on stderr that says what is wrong
and which setting or file to look at, and a non-zero exit.
"""

from __future__ import annotations

import importlib
from typing import Final, NoReturn

import click

from gateway import __version__
from gateway.files import FileError
from gateway.settings import Settings, SettingsError, load_settings

# Commands of each feature, as name → "module:attribute". A feature adds its
# line here; its module is imported only when the command runs.
FEATURE_COMMANDS: Final = {
    "init": "gateway.instance:init",
    "serve": "gateway.serving.cli:serve",
    "db": "gateway.migrations.cli:db",
}


def fail(message: str) -> NoReturn:
    """Stop the command with one clear line and exit status 1."""
    raise click.ClickException(message)


def settings() -> Settings:
    """The validated settings, or a one-line error naming the bad key."""
    context = click.get_current_context()
    cached = context.meta.get("gateway.settings")
    if cached is None:
        try:
            cached = load_settings()
        except (SettingsError, FileError) as error:
            fail(str(error))
        context.meta["gateway.settings"] = cached
    result: Settings = cached
    return result


class FeatureGroup(click.Group):
    """The top-level group, loading each feature's commands on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(FEATURE_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = FEATURE_COMMANDS.get(cmd_name)
        if spec is None:
            return None
        module_name, attribute = spec.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attribute)
        return command


@click.group(cls=FeatureGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gateway")
def main() -> None:
    """Secure entry portal for MCP URL-mode elicitations."""
