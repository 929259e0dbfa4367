"""How many long-polls ``gateway serve`` lets each worker hold: as many as open files allow."""

from __future__ import annotations

import logging
import resource

import click
import pytest

from gateway.serving import cli
from gateway.serving.server import ORDINARY_CONNECTIONS

BESIDE = ORDINARY_CONNECTIONS + cli.FILES_BESIDE_CONNECTIONS


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The open-file limit as ``serve`` finds it (the first entry) and as it sets it."""
    current: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: current[-1])
    monkeypatch.setattr(resource, "setrlimit", lambda _, pair: current.append(pair))
    return current


def test_the_soft_limit_is_raised_to_the_hard_one_and_ten_thousand_fit(
    limits: list[tuple[int, int]],
) -> None:
    limits.append((1024, 524_288))
    assert cli._waits_that_fit(None) == cli.DEFAULT_WAITS
    assert limits[-1] == (524_288, 524_288)


def test_a_low_hard_limit_holds_fewer_and_says_so(
    limits: list[tuple[int, int]], caplog: pytest.LogCaptureFixture,
) -> None:
    limits.append((4096, 4096))
    with caplog.at_level(logging.WARNING):
        assert cli._waits_that_fit(None) == 4096 - BESIDE
    assert "the open-file limit is 4096" in caplog.text


def test_more_waits_than_fit_are_refused_with_the_limit_named(
    limits: list[tuple[int, int]],
) -> None:
    limits.append((20_000, 20_000))
    with pytest.raises(click.ClickException) as refused:
        cli._waits_that_fit(20_000)
    assert "--waits 20,000 does not fit the open-file limit of 20,000" in refused.value.message
    assert cli._waits_that_fit(20_000 - BESIDE) == 20_000 - BESIDE
