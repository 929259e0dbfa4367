"""``gateway worker``: the background work of the gateway.

For now it sweeps: open elicitations whose time is up are marked expired
(reads report them expired on time anyway; the sweep makes the state, its
audit row and its webhook happen without anyone asking).
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Final

import click
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from gateway import cli
from gateway.clock import Clock, SystemClock
from gateway.db import make_engine
from gateway.elicitations.service import expire_overdue

log = logging.getLogger(__name__)
SWEEP_SECONDS: Final = 5.0


def sweep(factory: sessionmaker, clock: Clock) -> int:  # type: ignore[type-arg]
    """One pass of the sweeper, in one transaction; how many elicitations expired."""
    with factory() as session, session.begin():
        return expire_overdue(session, clock)


@click.command()
@click.option("--once", is_flag=True, help="Do one pass and exit (for cron or tests).")
def worker(once: bool) -> None:
    """Run the background work: expire elicitations whose time is up."""
    settings = cli.settings()
    engine = make_engine(settings.database_url)
    factory = sessionmaker(engine, expire_on_commit=False)
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        while True:
            try:
                expired = sweep(factory, SystemClock())
                if expired:
                    log.info("expired %d elicitation(s)", expired)
            except SQLAlchemyError as error:
                if once:
                    cli.fail(f"sweep failed ({type(error).__name__}); is the schema current? "
                             "run `gateway db upgrade`")
                log.warning("sweep failed (%s); trying again", type(error).__name__)
            if once or stop.wait(SWEEP_SECONDS):
                break
    finally:
        engine.dispose()
