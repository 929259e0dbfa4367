"""An unreachable rate-limit storage is said once per outage, and each uncounted request counted."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import Counter

from gateway.web.ratelimit import StorageWatch

WATCH_LOGGER = "gateway.web.ratelimit"


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage().split(" (")[0].split(":")[0])
            for r in caplog.records if r.name == WATCH_LOGGER]


def test_an_outage_is_said_once_then_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    uncounted = Counter("uncounted", "requests", registry=None)
    watch = StorageWatch(uncounted)
    with caplog.at_level(logging.INFO, logger=WATCH_LOGGER):
        watch.reachable()  # nothing was away: nothing to say
        for _ in range(50):
            watch.unreachable(ConnectionError("Error 111 connecting to 127.0.0.1:6379"))
        watch.reachable()
        watch.reachable()
        watch.unreachable(ConnectionError("Error 111 connecting to 127.0.0.1:6379"))
    assert said(caplog) == [("ERROR", "rate-limit storage unreachable"),
                            ("WARNING", "rate-limit storage reachable again"),
                            ("ERROR", "rate-limit storage unreachable")]
    assert "Error 111 connecting to 127.0.0.1:6379" in caplog.records[0].getMessage()
    [sample] = [s for s in uncounted.collect()[0].samples if s.name == "uncounted_total"]
    assert sample.value == 51
