"""The benchmark's command line: how both servers place their workers."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from gateway.serving.affinity import PRE_FORK
from tests.bench_modules import bench_module

pytestmark = pytest.mark.backend_independent


@pytest.fixture(scope="module")
def run() -> ModuleType:
    """bench/run.py."""
    return bench_module("run")


def test_workers_are_pinned_only_when_asked(run: ModuleType) -> None:
    assert run.parse_args([]).pin_workers is False
    assert run.parse_args(["--pin-workers"]).pin_workers is True
    servers = run.servers
    assert servers.gateway_options(8443, 2, 8, Path("unused")).pin_workers is False


def test_the_header_says_whether_workers_were_pinned(run: ModuleType) -> None:
    assert run.servers.describe_pinning({}) == ", workers not pinned"
    assert run.servers.describe_pinning({"pre_fork": PRE_FORK}) == ", each worker on one CPU"
