"""``gateway worker``: the background work of the gateway.

Two loops, each in its thread: the webhook dispatcher, which sends the
outbox, and the sweeper, which marks open elicitations whose time is up as
expired (reads report them expired on time anyway; the sweep makes the
state, its audit row and its webhook happen without anyone asking),
forgets the OAuth states of expired links and the login lockout's counters
whose window has ended. Any number of workers may run
against one database.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from datetime import timedelta
from types import FrameType
from typing import Final

import click
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from gateway import cli
from gateway.clock import Clock, SystemClock
from gateway.db import make_engine, unit_of_work
from gateway.elicitations.service import expire_overdue
from gateway.identity.lockout import Lockout
from gateway.oauth import states as oauth_states
from gateway.outbound import OutboundPolicy
from gateway.settings import Settings
from gateway.vault import versions
from gateway.vault.keyring import KeyringError
from gateway.webhooks.dispatcher import Dispatcher

log = logging.getLogger(__name__)
SWEEP_SECONDS: Final = 5.0


def sweep(engine: Engine, clock: Clock, lockout: Lockout) -> int:
    """One pass of the sweeper, in one transaction; how many elicitations expired.

    It also forgets the OAuth states of expired links and the login counters
    of ended windows.
    """
    with unit_of_work(engine) as session:
        oauth_states.forget_expired(session, clock)
        lockout.forget_ended(session, clock.now())
        return expire_overdue(session, clock)


def _sweep_forever(engine: Engine, lockout: Lockout, stop: threading.Event,
                   parent: int | None) -> None:
    while not stop.is_set():
        if parent is not None and os.getppid() != parent:
            # The `gateway serve` that started this worker is gone without
            # stopping it (killed): a worker nobody supervises must not go on.
            log.warning("the gateway serve (pid %d) that started this worker is gone; "
                        "stopping", parent)
            stop.set()
            return
        try:
            expired = sweep(engine, SystemClock(), lockout)
            if expired:
                log.info("expired %d elicitation(s)", expired)
        except SQLAlchemyError as error:
            log.warning("sweep failed (%s); trying again", type(error).__name__)
        stop.wait(SWEEP_SECONDS)


def _dispatcher(settings: Settings) -> Dispatcher:
    engine = make_engine(settings.database_url)
    try:
        keyring = versions.for_command(settings, engine, SystemClock(), role="worker")
    except KeyringError as error:
        cli.fail(str(error))
    policy = OutboundPolicy.from_settings(settings)
    if policy.insecure_hosts:
        log.warning("OUTBOUND GUARD RELAXED for %s (GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS): "
                    "development only", ", ".join(sorted(policy.insecure_hosts)))
    return Dispatcher(engine, SystemClock(), keyring, policy,
                      concurrency=settings.webhook_concurrency,
                      send_timeout=settings.webhook_send_timeout_seconds,
                      lease=timedelta(seconds=settings.webhook_lease_seconds))


@click.command()
@click.option("--once", is_flag=True,
              help="Sweep once and send what is due now, then exit (for cron or tests).")
@click.option("--stop-with", "parent", type=int, hidden=True,
              help="Stop when the process with this id is no longer this one's parent.")
def worker(once: bool, parent: int | None) -> None:
    """Send webhooks and expire elicitations whose time is up."""
    settings = cli.settings()  # which also starts logging as the settings say
    engine = make_engine(settings.database_url)
    lockout = Lockout.from_settings(settings)
    dispatcher = _dispatcher(settings)
    if once:
        try:
            expired = sweep(engine, SystemClock(), lockout)
            sent = dispatcher.run_once()
        except SQLAlchemyError as error:
            cli.fail(f"worker failed ({type(error).__name__}); is the schema current? "
                     "run `gateway db upgrade`")
        click.echo(f"expired {expired} elicitation(s); attempted {sent} webhook(s)")
        return
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    sweeper = threading.Thread(target=_sweep_forever, args=(engine, lockout, stop, parent),
                               name="sweeper", daemon=True)
    sweeper.start()
    log.info("worker started")
    try:
        dispatcher.run(stop)
    finally:
        sweeper.join(timeout=SWEEP_SECONDS + 1)
        engine.dispose()
        log.info("worker stopped")
