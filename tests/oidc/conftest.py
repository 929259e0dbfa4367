"""The provider's fixtures, for these tests even when the suite has not loaded them."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # tests/conftest.py normally lists the plugin; registering it twice is a no-op.
    config.pluginmanager.import_plugin("tests.oidc.fixtures")
