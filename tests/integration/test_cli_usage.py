"""Every command group answers a mistyped command with the closest names, and its help
shows each command's whole description."""

from __future__ import annotations

import re
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from gateway import cli
from gateway.cli import main

pytestmark = pytest.mark.backend_independent


def groups(group: click.Group = main, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], click.Group]]:
    """Every group of the ``gateway`` command tree with its path, the top one first."""
    yield path, group
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if isinstance(command, click.Group):
            yield from groups(command, (*path, name))


def subcommands() -> Iterator[tuple[tuple[str, ...], str]]:
    for path, group in groups():
        for name in group.list_commands(click.Context(group)):
            yield path, name


GROUPS = [pytest.param(path, group, id=" ".join(("gateway", *path))) for path, group in groups()]
SUBCOMMANDS = [pytest.param(path, name, id=" ".join(("gateway", *path, name)))
               for path, name in subcommands()]


def run(*args: str) -> click.testing.Result:
    return CliRunner().invoke(main, list(args), prog_name="gateway", catch_exceptions=False)


def test_the_tree_has_the_feature_groups() -> None:
    # Guards the parametrisation below: a walk that found nothing would test nothing.
    paths = {path for path, _ in groups()}
    assert {(), ("clients",), ("keys",), ("users",), ("webhooks",), ("db",)} <= paths


@pytest.mark.parametrize(("path", "group"), GROUPS)
def test_every_group_is_a_gateway_group(path: tuple[str, ...], group: click.Group) -> None:
    assert isinstance(group, cli.Group)


@pytest.mark.parametrize(("path", "name"), SUBCOMMANDS)
def test_a_mistyped_command_gets_the_name_it_was_meant_as(path: tuple[str, ...],
                                                          name: str) -> None:
    for typo in {name + name[-1], name[:-1] + "x" + name[-1]}:
        result = run(*path, typo)
        assert result.exit_code == 2
        suggested = re.search(r"Did you mean (?:one of )?(.*)\?", result.stderr)
        assert suggested, result.stderr
        assert repr(name) in suggested[1].split(", ")


def test_the_suggestion_reads_as_one_line() -> None:
    assert "Error: No such command 'stauts'. Did you mean 'status'?" in run("stauts").stderr
    assert "Try 'gateway --help' for help." in run("stauts").stderr
    rotate = run("clients", "rotate").stderr
    assert "Did you mean one of 'rotate-token', 'rotate-webhook-secret'" in rotate
    assert "Did you mean 'retire'?" in run("keys", "retrie").stderr


def test_a_name_like_none_lists_every_command() -> None:
    result = run("keys", "xyzzy")
    assert result.exit_code == 2
    assert "No such command 'xyzzy'. The commands are: list, retire, rewrap, rotate." \
        in result.stderr


def test_an_unknown_option_is_still_an_option_error() -> None:
    result = run("keys", "--xyzzy")
    assert result.exit_code == 2
    assert "No such option '--xyzzy'" in result.stderr


@pytest.mark.parametrize(("path", "group"), GROUPS)
def test_group_help_shows_whole_descriptions(path: tuple[str, ...], group: click.Group) -> None:
    result = run(*path, "--help")
    assert result.exit_code == 0, result.stderr
    commands = result.stdout.split("\nCommands:\n", 1)[1]
    assert "..." not in commands
    flowing = " ".join(commands.split())
    for name in group.list_commands(click.Context(group)):
        command = group.get_command(click.Context(group), name)
        assert command is not None
        first_sentence = " ".join(command.get_short_help_str(limit=10_000).split())
        assert first_sentence.endswith(".")
        assert f"{name} {first_sentence}" in flowing
