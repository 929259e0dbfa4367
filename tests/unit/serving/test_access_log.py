"""gunicorn's logger hands its records to the gateway's root handler."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from gunicorn.config import Config

from gateway.serving.access_log import GatewayLogger

pytestmark = pytest.mark.backend_independent


@pytest.fixture
def gunicorn_loggers() -> Iterator[list[logging.Logger]]:
    loggers = [logging.getLogger("gunicorn.error"), logging.getLogger("gunicorn.access")]
    saved = [(list(log.handlers), log.propagate, log.level) for log in loggers]
    yield loggers
    for log, (handlers, propagate, level) in zip(loggers, saved, strict=True):
        log.handlers[:] = handlers
        log.propagate = propagate
        log.setLevel(level)


def test_gunicorn_handlers_are_removed_and_others_kept(
    gunicorn_loggers: list[logging.Logger],
) -> None:
    other = logging.NullHandler()
    gunicorn_loggers[1].addHandler(other)
    config = Config()
    config.set("accesslog", "-")
    config.set("errorlog", "-")
    logger = GatewayLogger(config)
    logger.setup(config)  # a configuration reload runs it again
    error_log, access_log = gunicorn_loggers
    assert error_log.handlers == []
    assert access_log.handlers == [other]
    assert error_log.propagate
    assert access_log.propagate
