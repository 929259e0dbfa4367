"""Setting values in an instance's config file: the other lines stay, the file stays private."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gateway.files import FileError
from gateway.instance import set_config_values


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text('# kept\npublic_url = "https://localhost:8443"\nproxy_hops = 1\n')
    path.chmod(0o600)
    monkeypatch.setenv("GATEWAY_CONFIG", str(path))
    return path


def test_a_value_is_replaced_in_place_and_a_new_one_appended(config: Path) -> None:
    set_config_values({"public_url": "https://localhost:9443",
                       "outbound_allow_insecure_hosts": ("127.0.0.1:9", 'odd"host:1')})
    assert config.read_text() == (
        '# kept\npublic_url = "https://localhost:9443"\nproxy_hops = 1\n'
        'outbound_allow_insecure_hosts = ["127.0.0.1:9", "odd\\"host:1"]\n')
    assert stat.S_IMODE(config.stat().st_mode) == 0o600


def test_a_value_written_over_several_lines_is_left_alone(config: Path) -> None:
    config.write_text('outbound_allow_insecure_hosts = [\n  "127.0.0.1:9",\n]\n')
    before = config.read_text()
    with pytest.raises(FileError, match="a value spans several lines"):
        set_config_values({"outbound_allow_insecure_hosts": ("127.0.0.1:10",)})
    assert config.read_text() == before
