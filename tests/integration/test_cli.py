"""``gateway init`` and ``gateway db``: files, permissions, and one-line failures."""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

from tests.integration.conftest import Result


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def without_secrets(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items()
            if k not in ("GATEWAY_SECRET_KEY", "GATEWAY_TOKEN_PEPPER")}


def test_init_writes_private_files_with_fresh_secrets(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
) -> None:
    first_instance = tmp_path / "first"
    env = {**without_secrets(cli_environ), "GATEWAY_INSTANCE_PATH": str(first_instance)}
    result = invoke_gateway("init", env=env)
    assert result.code == 0, result.stderr
    config = first_instance / "gateway.toml"
    keyring = first_instance / "keyring"
    assert mode(config) == 0o600
    assert mode(keyring) == 0o600
    assert mode(first_instance) == 0o700
    second_instance = tmp_path / "second"
    invoke_gateway("init", env={**env, "GATEWAY_INSTANCE_PATH": str(second_instance)})
    assert config.read_text() != (second_instance / "gateway.toml").read_text()
    # The written config is complete: the gateway starts from it alone.
    assert invoke_gateway("db", "current", env=env).code == 0


def test_init_refuses_to_overwrite_and_changes_nothing(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], instance_path: Path,
) -> None:
    env = without_secrets(cli_environ)
    assert invoke_gateway("init", env=env).code == 0
    before = (instance_path / "gateway.toml").read_bytes()
    result = invoke_gateway("init", env=env)
    assert result.code == 1
    assert "already exists; refusing to overwrite" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert (instance_path / "gateway.toml").read_bytes() == before


def test_init_that_cannot_finish_leaves_nothing_behind(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], instance_path: Path,
) -> None:
    (instance_path / "keyring").write_text("kept\n")
    result = invoke_gateway("init", env=without_secrets(cli_environ))
    assert result.code == 1
    assert not (instance_path / "gateway.toml").exists()
    assert (instance_path / "keyring").read_text() == "kept\n"


def test_init_refuses_a_plain_http_public_url(invoke_gateway: Callable[..., Result],
                                              cli_environ: dict[str, str]) -> None:
    result = invoke_gateway("init", "--public-url", "http://portal.example.com",
                            env=without_secrets(cli_environ))
    assert result.code == 1
    assert "--public-url: must be an https:// origin" in result.stderr


def test_db_upgrade_then_current(invoke_gateway: Callable[..., Result], cli_environ: dict[str, str],
                                 empty_database_url: str) -> None:
    env = {**cli_environ, "GATEWAY_DATABASE_URL": empty_database_url}
    assert "(needs `gateway db upgrade`)" in invoke_gateway("db", "current", env=env).stdout
    upgraded = invoke_gateway("db", "upgrade", env=env)
    assert upgraded.code == 0, upgraded.stderr
    assert "upgraded from empty" in upgraded.stdout
    assert "(current)" in invoke_gateway("db", "current", env=env).stdout
    assert "database is current" in invoke_gateway("db", "upgrade", env=env).stdout


def test_malformed_config_stops_with_one_line(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], instance_path: Path,
) -> None:
    (instance_path / "gateway.toml").write_text("public_url = \n")
    (instance_path / "gateway.toml").chmod(0o600)
    result = invoke_gateway("db", "current", env=cli_environ)
    assert result.code == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert "gateway.toml: not valid TOML" in result.stderr


def test_unknown_setting_stops_with_one_line(invoke_gateway: Callable[..., Result],
                                             cli_environ: dict[str, str]) -> None:
    result = invoke_gateway("db", "current", env={**cli_environ, "GATEWAY_PORT": "1"})
    assert result.code == 1
    assert result.stderr.strip() == "Error: GATEWAY_PORT: unknown setting " \
        "(see config/gateway.example.toml)"


def test_missing_secret_stops_and_names_it(invoke_gateway: Callable[..., Result],
                                           cli_environ: dict[str, str]) -> None:
    result = invoke_gateway("db", "current", env=without_secrets(cli_environ))
    assert result.code == 1
    assert "GATEWAY_SECRET_KEY: not set" in result.stderr


def test_a_command_run_outside_the_instance_folder_says_where_it_looked(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
) -> None:
    # Run in tmp_path, whose instance/ (the default folder) holds no config.
    environ = {k: v for k, v in without_secrets(cli_environ).items()
               if k != "GATEWAY_INSTANCE_PATH"}
    result = invoke_gateway("status", env=environ)
    assert result.code == 1
    assert result.stderr.strip() == (
        "Error: GATEWAY_SECRET_KEY: not set, and there is no config file to read it from: "
        "GATEWAY_INSTANCE_PATH is not set, so the gateway looked in ./instance, the folder "
        f"{tmp_path.resolve() / 'instance'}, which has no gateway.toml. Set "
        "GATEWAY_INSTANCE_PATH to your instance folder, or run `gateway init` to make one here")


def test_an_instance_path_that_does_not_exist_is_named_as_given_and_resolved(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
) -> None:
    environ = {**without_secrets(cli_environ), "GATEWAY_INSTANCE_PATH": "elsewhere"}
    result = invoke_gateway("clients", "list", env=environ)
    assert result.code == 1
    assert (f"GATEWAY_INSTANCE_PATH is 'elsewhere', the folder {tmp_path.resolve()}/elsewhere, "
            "which does not exist. ") in result.stderr
    assert "`gateway init` to make one there" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_config_file_without_a_secret_is_named(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], instance_path: Path,
) -> None:
    config = instance_path / "gateway.toml"
    config.write_text(f'secret_key = "{"s" * 40}"\n')
    config.chmod(0o600)
    result = invoke_gateway("status", env=without_secrets(cli_environ))
    assert result.code == 1
    assert result.stderr.strip() == (f"Error: GATEWAY_TOKEN_PEPPER: not set, neither in {config} "
                                     "nor in the environment; add it to one of them")


def test_a_config_file_others_can_read_is_refused_like_the_keyring(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], instance_path: Path,
) -> None:
    config = instance_path / "gateway.toml"
    config.write_text(f'secret_key = "{"s" * 40}"\n')
    for readable in (0o640, 0o644):
        config.chmod(readable)
        result = invoke_gateway("status", env=cli_environ)
        assert result.code == 1
        assert result.stderr.strip() == (
            f"Error: GATEWAY_CONFIG: config file {config} is readable by group or others "
            f"(mode {readable:04o}); run: chmod 600 {config}")


def test_a_bad_setting_found_in_the_middle_of_a_command_is_one_line(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str],
) -> None:
    # Read only when the command needs it, after the settings loaded.
    result = invoke_gateway("clients", "create", "mcp", env={
        **cli_environ, "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": "no-port-here"})
    assert result.code == 1
    assert result.stderr.strip() == ("Error: GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS: expected "
                                     "host:port entries, got 'no-port-here'")
    result = invoke_gateway("clients", "create", "mcp", env={
        **cli_environ, "GATEWAY_DATABASE_URL": "nonsense"})
    assert result.code == 1
    assert result.stderr.strip() == ("Error: GATEWAY_DATABASE_URL: not a database URL "
                                     "(e.g. postgresql+psycopg://user@host/db)")
