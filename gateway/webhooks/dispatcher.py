"""Delivering the outbox: claim due events under a lease, send them, record each attempt.

Claiming is one UPDATE … WHERE id IN (SELECT … LIMIT n) … RETURNING: on
PostgreSQL the inner SELECT takes ``FOR UPDATE SKIP LOCKED``, so any number
of workers share the rows without waiting on each other; on SQLite the
statement runs under the database's single write lock, so claimers take
turns. A claim sets a lease; a worker that dies mid-delivery simply lets it
run out, and the event is claimed and sent again with the same
``webhook-id``. Every result is written only if the claim is still ours.

The dispatcher sleeps on the database's change signal (see
:mod:`gateway.changes`), so an event committed anywhere is picked up at once,
not on the next tick of a slow poll.
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import os
import queue
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import Engine, Row, and_, bindparam, delete, func, insert, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from urllib3.exceptions import HTTPError, NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3TimeoutError

from gateway import changes
from gateway.clients.models import Client
from gateway.clients.service import current_webhook_secrets
from gateway.clock import Clock
from gateway.db import for_reads
from gateway.outbound import BlockedDestination, GuardedPool, OutboundPolicy, finish
from gateway.tokens import new_id
from gateway.vault.envelope import VaultError
from gateway.vault.keyring import KeyringError, KeySource
from gateway.webhooks import signing
from gateway.webhooks.models import WebhookAttempt, WebhookEvent, WorkerHeartbeat

log = logging.getLogger(__name__)

# The wait before each attempt: at once, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
SCHEDULE: Final = (timedelta(0), timedelta(seconds=5), timedelta(minutes=5),
                   timedelta(minutes=30), timedelta(hours=2), timedelta(hours=5),
                   timedelta(hours=10), timedelta(hours=10))
JITTER: Final = 0.2
# The defaults of GATEWAY_WEBHOOK_SEND_TIMEOUT_SECONDS and GATEWAY_WEBHOOK_LEASE_SECONDS.
SEND_TIMEOUT_SECONDS: Final = 15.0
# Longer than a send can take, so a live worker never loses its claim.
LEASE: Final = timedelta(seconds=60)
# A receiver may ask for more time, never for more than the schedule's longest
# wait: an absurd Retry-After must not park an event for ever.
MAX_RETRY_AFTER: Final = max(SCHEDULE)
IDLE_WAIT_SECONDS: Final = 1.0
# Why an attempt failed when the client's signing secret does not open (a
# database restored beside another keyring, a damaged row): the operator's
# fix, and nothing of the secret.
CANNOT_SIGN: Final = ("the webhook signing secret cannot be opened: restore the keyring it "
                      "was sealed with")
ERROR_LENGTH: Final = 500  # the columns that keep an attempt's error
# Heartbeats older than this belong to workers long gone (killed, or hosts
# retired): whoever writes one deletes them.
HEARTBEAT_KEPT: Final = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Claim:
    """An event this worker holds, and which attempt this is."""

    event_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Result:
    """What one attempt came to."""

    delivered: bool
    status_code: int | None
    latency_ms: int
    error: str | None
    retry_after: timedelta | None = None


def delay_before(attempt: int, rng: random.Random) -> timedelta:
    """The wait before attempt number ``attempt`` (2…8), with ±20 % jitter."""
    base = SCHEDULE[attempt - 1]
    return base * (1 + rng.uniform(-JITTER, JITTER))


@dataclass(frozen=True, slots=True)
class _Job:
    """A claimed event with what sending it needs, read in the claim's transaction."""

    claim: Claim
    body: str
    url: str | None
    secrets: list[str] | None  # None: the client's secret does not open


Outcome = tuple[Claim, datetime, Result]


class Dispatcher:
    """Claims due events in batches, sends them with a pool of threads, records in batches.

    ``run`` keeps up to twice ``concurrency`` events claimed: one per sending
    thread and as many waiting for the next free thread, so it claims in
    batches rather than one event per transaction. A waiting event starts
    within one send timeout, well inside its lease. Outcomes go to one
    recording thread, which writes whatever has accumulated in one
    transaction: under load, many outcomes per commit; when idle, each at once.
    """

    def __init__(self, engine: Engine, clock: Clock, keyring: KeySource, policy: OutboundPolicy,
                 *, concurrency: int = 8, rng: random.Random | None = None,
                 send_timeout: float = SEND_TIMEOUT_SECONDS, lease: timedelta = LEASE,
                 worker_id: str | None = None) -> None:
        # A claimed event may wait one send for a free thread, then take one
        # send: both must fit in the lease with room to spare.
        if not 0 < send_timeout < lease.total_seconds() / 3:
            raise ValueError("a send must time out well within the lease")
        self._engine = engine
        self._reader = for_reads(engine)  # made once: it runs at every wake-up
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._clock = clock
        self._keyring = keyring
        self._policy = policy
        self._concurrency = concurrency
        self._send_timeout = send_timeout
        self._lease = lease
        self._rng = rng or random.Random()  # noqa: S311  (jitter, not secrecy)
        self.worker_id = worker_id or f"{socket.gethostname()[:60]}:{os.getpid()}:{new_id('', 6)}"
        self._beaten_at: datetime | None = None
        self._in_flight = 0  # claimed by run() and not yet sent
        self._slots = threading.Condition()
        # One pool of kept-alive connections for every sending thread.
        self._http = GuardedPool(policy, connections_per_host=concurrency)

    # --- the loop ----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Deliver until ``stop`` is set; then finish the sends under way and record them."""
        listener: changes.Listener | None = None
        recorder = _Recorder(self._write_outcomes)
        try:
            with ThreadPoolExecutor(self._concurrency, thread_name_prefix="webhook") as pool:
                while not stop.is_set():
                    try:
                        if listener is None:
                            listener = changes.open_listener(self._engine)
                        self._step(pool, recorder, listener, stop)
                    except Exception as error:
                        # The database went away (restart, failover): keep trying,
                        # on a new listening connection, rather than stop sending.
                        log.warning("dispatching webhooks failed (%s); trying again",
                                    type(error).__name__)
                        if listener is not None:
                            with contextlib.suppress(Exception):
                                listener.close()
                            listener = None
                        stop.wait(IDLE_WAIT_SECONDS)
        finally:
            if listener is not None:
                listener.close()
            recorder.close()
            self._http.clear()
            self._forget_heartbeat()

    def _step(self, pool: ThreadPoolExecutor, recorder: _Recorder, listener: changes.Listener,
              stop: threading.Event) -> None:
        """Claim what there is room for and hand it to the pool; with nothing due, sleep."""
        room = self._room(stop)
        if not room:
            return
        jobs = self._claim_jobs(room)
        with self._slots:
            self._in_flight += len(jobs)
        for job in jobs:
            pool.submit(self._send_and_report, job, recorder)
        self._beat()
        if not jobs:
            listener.wait(self._idle_wait())

    def run_once(self) -> int:
        """Claim and deliver what is due now, waiting for those sends; how many."""
        jobs = self._claim_jobs(self._concurrency)
        with ThreadPoolExecutor(max(1, len(jobs))) as pool:
            list(pool.map(self._send_and_record, jobs))
        self._beat()
        return len(jobs)

    def _room(self, stop: threading.Event) -> int:
        """How many more events to claim: none until at least half the window is free."""
        with self._slots:
            while self._in_flight > self._concurrency and not stop.is_set():
                self._slots.wait(0.5)
            return 0 if stop.is_set() else 2 * self._concurrency - self._in_flight

    def _send_and_report(self, job: _Job, recorder: _Recorder) -> None:
        try:
            recorder.put((job.claim, *self._attempt(job)))
        finally:
            with self._slots:
                self._in_flight -= 1
                self._slots.notify()

    def _send_and_record(self, job: _Job) -> Result:
        started, result = self._attempt(job)
        self._write_outcomes([(job.claim, started, result)])
        return result

    # --- the heartbeat -----------------------------------------------------------------

    def _beat(self) -> None:
        """Note that this worker has just looked for due work, a few times per lease.

        ``/readyz`` and ``gateway status`` read it: events overdue by more
        than a lease while no worker has looked are a worker that died or
        hangs, not a busy one.
        """
        now = self._clock.now()
        if self._beaten_at is not None and now - self._beaten_at < self._lease / 3:
            return
        try:
            with self._engine.begin() as connection:
                found = connection.execute(update(WorkerHeartbeat).where(
                    WorkerHeartbeat.id == self.worker_id).values(polled_at=now)).rowcount
                if not found:
                    connection.execute(delete(WorkerHeartbeat).where(
                        WorkerHeartbeat.polled_at < now - HEARTBEAT_KEPT))
                    connection.execute(insert(WorkerHeartbeat).values(
                        id=self.worker_id, started_at=now, polled_at=now))
        except SQLAlchemyError as error:
            # Sending matters more than saying so; the next beat tries again.
            log.warning("could not record this worker's heartbeat (%s)", type(error).__name__)
            return
        self._beaten_at = now

    def _forget_heartbeat(self) -> None:
        """A worker that stops says so, rather than look alive for another lease."""
        if self._beaten_at is None:
            return
        try:
            with self._engine.begin() as connection:
                connection.execute(delete(WorkerHeartbeat).where(
                    WorkerHeartbeat.id == self.worker_id))
        except SQLAlchemyError as error:
            log.warning("could not remove this worker's heartbeat (%s)", type(error).__name__)

    def _idle_wait(self) -> float:
        with self._sessions() as session:
            soonest = session.scalar(select(func.min(WebhookEvent.next_attempt_at)).where(
                WebhookEvent.status == "pending"))
        if soonest is None:
            return IDLE_WAIT_SECONDS
        wait = (soonest - self._clock.now()).total_seconds()
        return min(max(wait, 0.0), IDLE_WAIT_SECONDS)

    # --- claiming ------------------------------------------------------------------

    def claim(self, limit: int) -> list[Claim]:
        """Take up to ``limit`` due events under a lease, in one statement."""
        with self._sessions.begin() as session:
            return [Claim(row.id, row.attempts) for row in self._claim_rows(session, limit)]

    def _claim_rows(self, session: Session, limit: int) -> Sequence[Row[str, int, str, str]]:
        now = self._clock.now()
        due = select(WebhookEvent.id).where(or_(
            and_(WebhookEvent.status == "pending", WebhookEvent.next_attempt_at <= now),
            and_(WebhookEvent.status == "delivering", WebhookEvent.lease_until <= now),
        )).order_by(WebhookEvent.next_attempt_at).limit(limit)
        # A read first, on a connection of its own that only reads: a wake-up
        # with nothing due (the signal also fires for other changes) then
        # begins no write transaction, and on SQLite takes no write lock from
        # the requests that are writing.
        with self._reader.connect() as reader:
            if reader.scalar(due.limit(1)) is None:
                return []
        if self._engine.dialect.name == "postgresql":
            due = due.with_for_update(skip_locked=True)
        return session.execute(
            update(WebhookEvent).where(WebhookEvent.id.in_(due.scalar_subquery()))
            .values(status="delivering", lease_until=now + self._lease,
                    attempts=WebhookEvent.attempts + 1)
            .returning(WebhookEvent.id, WebhookEvent.attempts, WebhookEvent.client_id,
                       WebhookEvent.body)
            .execution_options(synchronize_session=False)).all()

    def _claim_jobs(self, limit: int) -> list[_Job]:
        """Claim, and read each client's URL and secrets once for the whole batch."""
        with self._sessions.begin() as session:
            rows = self._claim_rows(session, limit)
            if not rows:
                return []
            clients = {client.id: client for client in session.scalars(
                select(Client).where(Client.id.in_({row.client_id for row in rows})))}
            secrets = {client_id: self._secrets_of(session, client)
                       for client_id, client in clients.items()}
        return [_Job(Claim(row.id, row.attempts), row.body,
                     clients[row.client_id].webhook_url, secrets[row.client_id])
                for row in rows]

    # --- one attempt -----------------------------------------------------------------

    def deliver(self, claim: Claim) -> Result:
        """Send one claimed event and record what happened."""
        with self._sessions() as session:
            event = session.get(WebhookEvent, claim.event_id)
            assert event is not None
            client = session.get(Client, event.client_id)
            assert client is not None
            job = _Job(claim, event.body, client.webhook_url, self._secrets_of(session, client))
        return self._send_and_record(job)

    def _secrets_of(self, session: Session, client: Client) -> list[str] | None:
        """The client's signing secrets; None when they do not open.

        One client's damaged secret must cost only that client's events: the
        claim that read it still commits, and everyone else's are sent.
        """
        try:
            return current_webhook_secrets(session, self._clock, self._keyring, client)
        except (VaultError, KeyringError) as error:
            log.warning("client %s: %s (%s)", client.id, CANNOT_SIGN, type(error).__name__,
                        extra={"client_id": client.id})
            return None

    def _attempt(self, job: _Job) -> tuple[datetime, Result]:
        """Send, and say what came of it; never raises, so every attempt is recorded."""
        started = self._clock.now()
        if not job.url:
            return started, Result(False, None, 0, "the client has no webhook URL")
        if job.secrets is None:
            return started, Result(False, None, 0, CANNOT_SIGN)
        begun = time.monotonic()
        try:
            return started, self._send(job.url, job.secrets, job.claim.event_id, job.body)
        except Exception as error:
            # An attempt that is not recorded is sent again after every lease,
            # for ever: record it as failed, so the schedule runs its course.
            log.exception("delivering %s failed unexpectedly", job.claim.event_id,
                          extra={"event_id": job.claim.event_id, "attempt": job.claim.attempt})
            return started, Result(False, None, _elapsed(begun),
                                   f"the attempt failed unexpectedly ({type(error).__name__})")

    def _send(self, url: str, secrets: list[str], event_id: str, body: str) -> Result:
        # Signed at send time: each attempt carries a fresh timestamp, so a
        # receiver's replay window never rejects a late retry.
        timestamp = int(self._clock.now().timestamp())
        headers = signing.headers(secrets, event_id, timestamp, body)
        headers["Content-Type"] = "application/json"
        headers["User-Agent"] = "gateway-webhooks/1"
        begun = time.monotonic()
        try:
            response = self._http.post(url, body.encode(), headers, self._send_timeout)
        except BlockedDestination as error:
            return Result(False, None, _elapsed(begun), str(error))
        except (HTTPError, OSError) as error:
            elapsed = _elapsed(begun)
            # Past the deadline, whatever broke was the attempt being cut off.
            timed_out = elapsed >= self._send_timeout * 1000
            return Result(False, None, elapsed, "timed out" if timed_out else _describe(error))
        status = response.status
        retry_after = response.headers.get("Retry-After")
        finish(response)
        if 200 <= status < 300:
            return Result(True, status, _elapsed(begun), None)
        return Result(False, status, _elapsed(begun), f"answered {status}",
                      _retry_after(retry_after, self._clock.now()))

    # --- recording -------------------------------------------------------------------

    def _write_outcomes(self, outcomes: Sequence[Outcome]) -> None:
        """Record attempts, each event's only while its claim is ours.

        An attempt left unrecorded is sent again after every lease, for ever:
        when the batch fails, each attempt is written alone, and one that still
        fails is written as a failed attempt that says so.
        """
        try:
            self._write_batch(outcomes)
        except Exception as error:
            log.warning("recording %d webhook attempt(s) failed (%s); recording each alone",
                        len(outcomes), type(error).__name__)
            for outcome in outcomes:
                self._write_alone(outcome)

    def _write_alone(self, outcome: Outcome) -> None:
        claim, started, result = outcome
        try:
            self._write_batch([outcome])
        except Exception as error:
            reason = f"recording the attempt failed ({type(error).__name__})"
            log.warning("webhook %s: %s", claim.event_id, reason,
                        extra={"event_id": claim.event_id, "attempt": claim.attempt})
            self._write_batch([(claim, started, Result(False, result.status_code,
                                                       result.latency_ms, reason))])

    def _write_batch(self, outcomes: Sequence[Outcome]) -> None:
        """Record attempts in one transaction.

        Three statements, one per kind of outcome, each run once for all the
        events of its kind (an executemany), and one insert for the log.
        """
        now = self._clock.now()
        delivered: list[dict[str, object]] = []
        retried: list[dict[str, object]] = []
        dead: list[dict[str, object]] = []
        for claim, _started, result in outcomes:
            key = {"b_id": claim.event_id, "b_attempt": claim.attempt}
            if result.delivered:
                delivered.append({**key, "b_now": now})
            elif claim.attempt >= len(SCHEDULE):
                dead.append({**key, "b_error": _error_text(result.error)})
            else:
                wait = delay_before(claim.attempt + 1, self._rng)
                if result.retry_after is not None:
                    wait = max(wait, min(result.retry_after, MAX_RETRY_AFTER))
                retried.append({**key, "b_next": now + wait,
                                "b_error": _error_text(result.error)})
        taken = 0
        with self._engine.begin() as connection:
            for statement, rows in ((_DELIVERED, delivered), (_RETRIED, retried), (_DEAD, dead)):
                if rows:
                    taken += connection.execute(statement, rows).rowcount
            connection.execute(insert(WebhookAttempt), [
                {"event_id": claim.event_id, "number": claim.attempt, "started_at": started,
                 "status_code": result.status_code, "latency_ms": result.latency_ms,
                 "outcome": "delivered" if result.delivered else "failed",
                 "error": _error_text(result.error)}
                for claim, started, result in outcomes])
        for claim, _started, result in outcomes:
            _log_outcome(claim, result)
        if taken != len(outcomes):
            # Another worker took these over when their lease ran out; its
            # outcome stands, and these attempts are only logged.
            log.warning("the lease ran out during %d of %d attempt(s): %s",
                        len(outcomes) - taken, len(outcomes),
                        ", ".join(f"{claim.event_id}#{claim.attempt}"
                                  for claim, _, _ in outcomes[:10]),
                        extra={"event_ids": [claim.event_id for claim, _, _ in outcomes]})


# Writing an outcome: only while the claim is still ours, i.e. the event is
# still being delivered under this attempt number. A worker whose lease ran
# out must not overwrite the outcome of the one that took over.
_OURS: Final = and_(WebhookEvent.id == bindparam("b_id"), WebhookEvent.status == "delivering",
                    WebhookEvent.attempts == bindparam("b_attempt"))
_DELIVERED: Final = update(WebhookEvent).where(_OURS).values(
    status="delivered", delivered_at=bindparam("b_now"), lease_until=None, last_error=None)
_RETRIED: Final = update(WebhookEvent).where(_OURS).values(
    status="pending", next_attempt_at=bindparam("b_next"), lease_until=None,
    last_error=bindparam("b_error"))
_DEAD: Final = update(WebhookEvent).where(_OURS).values(
    status="dead", lease_until=None, last_error=bindparam("b_error"))


class _Recorder:
    """One thread writing outcomes as they come, all that are waiting in one transaction."""

    MAX_BATCH: Final = 500

    def __init__(self, write: Callable[[Sequence[Outcome]], None]) -> None:
        self._write = write
        self._queue: queue.SimpleQueue[Outcome | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="webhook-recorder", daemon=True)
        self._thread.start()

    def put(self, outcome: Outcome) -> None:
        self._queue.put(outcome)

    def close(self) -> None:
        """Write what is left, then stop."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        closing = False
        while not closing:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    closing = True
                    break
                batch.append(more)
            try:
                self._write(batch)
            except Exception:
                log.exception("recording %d webhook attempt(s) failed; their leases will run "
                              "out and they will be sent again", len(batch))


def _log_outcome(claim: Claim, result: Result) -> None:
    """One line per attempt, naming its event (the outbox row and the ``webhook-id``)."""
    fields = {"event_id": claim.event_id, "attempt": claim.attempt,
              "status_code": result.status_code, "duration_ms": result.latency_ms}
    if result.delivered:
        log.info("webhook %s delivered on attempt %d (HTTP %s, %d ms)", claim.event_id,
                 claim.attempt, result.status_code, result.latency_ms,
                 extra={**fields, "outcome": "delivered"})
    elif claim.attempt >= len(SCHEDULE):
        log.warning("webhook %s failed on its last attempt (%d): %s; it is dead until "
                    "redelivered", claim.event_id, claim.attempt, result.error,
                    extra={**fields, "outcome": "dead"})
    else:
        log.info("webhook %s failed on attempt %d: %s; it will be retried", claim.event_id,
                 claim.attempt, result.error, extra={**fields, "outcome": "retry"})


def _elapsed(begun: float) -> int:
    return round((time.monotonic() - begun) * 1000)


def _describe(error: HTTPError | OSError) -> str:
    # A failure to connect is a urllib3 ConnectTimeoutError too: test it first.
    if isinstance(error, NewConnectionError):
        return "connection failed"
    if isinstance(error, Urllib3TimeoutError | TimeoutError):
        return "timed out"
    return "connection failed"


def _error_text(error: str | None) -> str | None:
    """An error as its columns hold it: a longer one must not fail the whole record."""
    return (error or "")[:ERROR_LENGTH] or None


_SECONDS: Final = re.compile(r"[0-9]+")


def _retry_after(value: str | None, now: datetime) -> timedelta | None:
    """Retry-After as seconds or an HTTP date, at most MAX_RETRY_AFTER; None when unreadable.

    The receiver writes this header: any text at all must come out as a wait
    or as None, never as an exception.
    """
    value = (value or "").strip()
    if _SECONDS.fullmatch(value):
        # Capped before a timedelta is made, whose days twenty digits
        # overflow, and by length before int(), which refuses thousands.
        digits = value.lstrip("0") or "0"
        if len(digits) > len(str(int(MAX_RETRY_AFTER.total_seconds()))) \
                or int(digits) >= MAX_RETRY_AFTER.total_seconds():
            return MAX_RETRY_AFTER
        return timedelta(seconds=int(digits))
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    if moment.tzinfo is None:
        return None
    return min(max(moment - now, timedelta(0)), MAX_RETRY_AFTER)
