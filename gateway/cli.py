"""The ``gateway`` command group. Each feature registers its own commands.

Every command fails the same way: one line on stderr that says what is wrong
and which setting or file to look at, and a non-zero exit.
"""

from __future__ import annotations

import difflib
import getpass
import importlib
import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar

import click
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from gateway import __version__
from gateway.errors import GatewayError
from gateway.files import FileError
from gateway.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from gateway.vault.keyring import KeySource
    from gateway.vault.versions import KeyVersions

T = TypeVar("T")

# Commands of each feature, as name → "module:attribute". A feature adds its
# line here; its module is imported only when the command runs.
FEATURE_COMMANDS: Final = {
    "init": "gateway.instance:init",
    "serve": "gateway.serving.cli:serve",
    "worker": "gateway.worker:worker",
    "db": "gateway.migrations.cli:db",
    "clients": "gateway.clients.cli:clients",
    "elicitations": "gateway.elicitations.cli:elicitations",
    "payments": "gateway.payments.cli:payments",
    "users": "gateway.identity.cli:users",
    "keys": "gateway.vault.cli:keys",
    "credentials": "gateway.credentials.cli:credentials",
    "webhooks": "gateway.webhooks.cli:webhooks",
    "audit": "gateway.audit.cli:audit",
    "status": "gateway.status:status",
    "demo": "gateway.demo:demo",
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
        _start_logging(cached, context)
    result: Settings = cached
    return result


def _start_logging(settings: Settings, context: click.Context) -> None:
    # Every command that reads the settings logs the way they say, to stderr:
    # stdout stays for what the command prints (a secret shown once, --json).
    from gateway import logs

    logs.configure(settings)
    logging.getLogger(__name__).debug("%s: database %s, log format %s", context.command_path,
                                      _printable_database(settings.database_url),
                                      settings.log_format)


def _printable_database(url: str) -> str:
    """The database URL without its password, for a log line."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(not a database URL)"


def operator() -> str:
    """The audit trail's name for whoever runs this command."""
    return f"operator:{getpass.getuser()}"


@contextmanager
def transaction(*, sealing: bool = False) -> Iterator[Session]:
    """One transaction on the configured database; domain errors become one line.

    ``sealing``: the refusal of a secret sealed under a key version retired
    meanwhile is raised as it is, for :func:`sealed_transaction` to seal again.
    """
    from gateway.db import make_engine, unit_of_work
    from gateway.vault.sealing import refers_to_missing_version

    engine = make_engine(settings().database_url)
    try:
        with unit_of_work(engine) as session:
            yield session
    except GatewayError as error:
        fail(error.detail)
    except SQLAlchemyError as error:
        if sealing and isinstance(error, IntegrityError) and refers_to_missing_version(error):
            raise
        fail(f"database error ({error.__class__.__name__}); is the schema current? "
             "run `gateway db upgrade`")
    finally:
        engine.dispose()


def sealed_transaction(keyring: KeySource, work: Callable[[Session], T]) -> T:
    """``work`` in one transaction that seals a secret, run again (sealing anew) if need be.

    Its key version may be retired before the transaction commits; ``work``
    then runs again, sealing under the current version.
    """
    from gateway.vault.sealing import store_sealed

    def attempt() -> T:
        with transaction(sealing=True) as session:
            return work(session)

    try:
        return store_sealed(keyring, attempt)
    except IntegrityError:
        fail("the key version kept being retired while the secret was stored; try again")


def key_versions() -> KeyVersions:
    """The vault's key versions for this command, its keyring read now; one line if it is bad."""
    from gateway.vault.keyring import KeyringError

    try:
        return open_key_versions()
    except KeyringError as error:
        fail(str(error))


def open_key_versions() -> KeyVersions:
    """The vault's key versions for this command; raises KeyringError if the keyring is bad.

    For a command that can go on without the vault, saying what it could not do.
    """
    from gateway.clock import SystemClock
    from gateway.db import make_engine
    from gateway.vault import versions

    engine = make_engine(settings().database_url)
    context = click.get_current_context()
    context.call_on_close(engine.dispose)
    store = versions.for_command(settings(), engine, SystemClock(), role="cli")
    # Once the command ends it wraps nothing more: its heartbeat must not hold
    # a version that `gateway keys retire` could otherwise retire at once.
    context.call_on_close(store.withdraw)
    return store


def echo_json(value: Any) -> None:
    """Print a value as indented JSON, for scripts."""
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def echo_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Print rows as an aligned table with a header, or say there are none."""
    if not rows:
        click.echo("(none)")
        return
    cells = [[cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in cells))
              for i, column in enumerate(columns)]
    click.secho("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))
                .rstrip(),
                bold=True)
    for line in cells:
        click.echo("  ".join(value.ljust(w) for value, w in zip(line, widths, strict=True))
                   .rstrip())


def cell(value: Any) -> str:
    """A value as one printable line of a table."""
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) or "-"
    # One line per row, and no terminal control sequences from what clients sent.
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(value))


def close_names(typed: str, names: Sequence[str]) -> list[str]:
    """The names a mistyped command was most likely meant as.

    Names that start with or contain what was typed (``rotate`` for
    ``rotate-token`` and ``rotate-webhook-secret``), then close spellings
    (``stauts`` for ``status``), closest first.
    """
    typed = typed.lower()
    holding = [name for name in names
               if name.startswith(typed) or (len(typed) >= 4 and typed in name)]
    close = difflib.get_close_matches(typed, names, n=3, cutoff=0.6)
    return list(dict.fromkeys([*holding, *close]))


def no_such_command(typed: str, names: Sequence[str]) -> str:
    """The message for an unknown command: the closest names, or all of them."""
    found = close_names(typed, names)
    quoted = ", ".join(repr(name) for name in found)
    if len(found) == 1:
        return f"No such command {typed!r}. Did you mean {quoted}?"
    if found:
        return f"No such command {typed!r}. Did you mean one of {quoted}?"
    return f"No such command {typed!r}. The commands are: {', '.join(names)}."


class Group(click.Group):
    """A command group of the gateway; every group, at every level, is one of these.

    A mistyped command is answered with the closest names (Click suggests
    only from a group's registered commands, which lazily loaded groups do
    not fill, and only from version 8.4). The help lists each command with
    its whole first sentence: Click cuts it to fit one line, with "...".
    """

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        typed = click.utils.make_str(args[0])
        if (self.get_command(ctx, typed) is None and not ctx.resilient_parsing
                and not typed.startswith("-")):  # an option: Click parses it again
            visible = [name for name in self.list_commands(ctx)
                       if not getattr(self.get_command(ctx, name), "hidden", True)]
            raise click.UsageError(no_such_command(typed, visible), ctx)
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=sys.maxsize)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class FeatureGroup(Group):
    """The top-level group, loading each feature's commands on demand.

    Every command runs inside it: a setting, a file or the keyring found bad
    at any point of a command (some are read only when first needed) is one
    line, never a traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        from gateway.vault.keyring import KeyringError

        try:
            return super().invoke(ctx)
        except (SettingsError, FileError, KeyringError) as error:
            raise click.ClickException(str(error)) from None

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
