"""The keyring: from the environment or a private file, with errors that say where."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.instance import keyring_text
from gateway.settings import Settings
from gateway.vault.keyring import KeyringError, load_keyring, parse_keyring, read_keyring_file

KEY_1 = base64.b64encode(os.urandom(32)).decode()
KEY_2 = base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
def base_environ(base_environ: dict[str, str]) -> dict[str, str]:
    """The test environment without GATEWAY_ENCRYPTION_KEYS, so the instance file counts."""
    return {k: v for k, v in base_environ.items() if k != "GATEWAY_ENCRYPTION_KEYS"}


def test_environment_keyring_newest_version_is_current(
    make_settings: Callable[..., Settings],
) -> None:
    keyring = load_keyring(make_settings(GATEWAY_ENCRYPTION_KEYS=f"v2:{KEY_2},v1:{KEY_1}"))
    assert keyring.current_version == 2
    assert keyring.key(1) == base64.b64decode(KEY_1)


def test_instance_keyring_file_is_read(settings: Settings, instance_path: Path) -> None:
    path = instance_path / "keyring"
    path.write_text(f"# comment\nv1:{KEY_1}\n")
    path.chmod(0o600)
    assert load_keyring(settings).current_version == 1


def test_keyring_file_readable_by_others_is_refused(settings: Settings,
                                                    instance_path: Path) -> None:
    path = instance_path / "keyring"
    path.write_text(f"v1:{KEY_1}\n")
    path.chmod(0o640)
    with pytest.raises(KeyringError, match="readable by group or others"):
        load_keyring(settings)


def test_missing_keyring_file_says_what_to_do(settings: Settings) -> None:
    with pytest.raises(KeyringError, match="run `gateway init` or set GATEWAY_ENCRYPTION_KEYS"):
        load_keyring(settings)


@pytest.mark.parametrize(("entries", "problem"), [
    ([f"x1:{KEY_1}"], "entries look like v1:<base64>"),
    (["v1:not*base64"], "v1 is not valid base64"),
    ([f"v1:{base64.b64encode(b'short').decode()}"], "v1 must be 32 bytes, not 5"),
    ([f"v1:{KEY_1}", f"v1:{KEY_2}"], "v1 appears twice"),
    ([], "holds no key"),
])
def test_malformed_keyrings_are_named(entries: list[str], problem: str) -> None:
    with pytest.raises(KeyringError, match=problem) as caught:
        parse_keyring(entries, "GATEWAY_ENCRYPTION_KEYS")
    assert str(caught.value).startswith("GATEWAY_ENCRYPTION_KEYS: ")
    assert KEY_1 not in str(caught.value)


def test_the_keyring_written_by_init_loads(tmp_path: Path) -> None:
    path = tmp_path / "keyring"
    path.write_text(keyring_text())
    path.chmod(0o600)
    assert read_keyring_file(path).current_version == 1
