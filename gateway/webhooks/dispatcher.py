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

import email.utils
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import requests
from sqlalchemy import Engine, and_, func, or_, select, update
from sqlalchemy.orm import sessionmaker

from gateway import changes
from gateway.clients.models import Client
from gateway.clients.service import current_webhook_secrets
from gateway.clock import Clock
from gateway.vault.keyring import Keyring
from gateway.webhooks import signing
from gateway.webhooks.http import BlockedDestination, OutboundPolicy, guarded_session
from gateway.webhooks.models import WebhookAttempt, WebhookEvent

log = logging.getLogger(__name__)

# The wait before each attempt: at once, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
SCHEDULE: Final = (timedelta(0), timedelta(seconds=5), timedelta(minutes=5),
                   timedelta(minutes=30), timedelta(hours=2), timedelta(hours=5),
                   timedelta(hours=10), timedelta(hours=10))
JITTER: Final = 0.2
SEND_TIMEOUT_SECONDS: Final = 15.0
# Longer than a send can take, so a live worker never loses its claim.
LEASE: Final = timedelta(seconds=60)
MAX_RETRY_AFTER: Final = timedelta(hours=10)
IDLE_WAIT_SECONDS: Final = 1.0


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


class Dispatcher:
    """Claims and sends due events with a pool of threads."""

    def __init__(self, engine: Engine, clock: Clock, keyring: Keyring, policy: OutboundPolicy,
                 *, concurrency: int = 8, rng: random.Random | None = None) -> None:
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._clock = clock
        self._keyring = keyring
        self._policy = policy
        self._concurrency = concurrency
        self._rng = rng or random.Random()  # noqa: S311  (jitter, not secrecy)
        self._busy = threading.Semaphore(concurrency)
        self._http = threading.local()

    # --- the loop ----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Deliver until ``stop`` is set."""
        listener = changes.open_listener(self._engine)
        with ThreadPoolExecutor(self._concurrency, thread_name_prefix="webhook") as pool:
            try:
                while not stop.is_set():
                    claimed = self._claim_free()
                    for claim in claimed:
                        pool.submit(self._deliver_and_release, claim)
                    if not claimed:
                        listener.wait(self._idle_wait())
            finally:
                listener.close()

    def run_once(self) -> int:
        """Claim and deliver what is due now, waiting for those sends; how many."""
        claimed = self.claim(self._concurrency)
        with ThreadPoolExecutor(max(1, len(claimed))) as pool:
            list(pool.map(self.deliver, claimed))
        return len(claimed)

    def _claim_free(self) -> list[Claim]:
        free = 0
        while self._busy.acquire(blocking=False):
            free += 1
        if not free:
            time.sleep(0.01)  # every thread is sending; let one finish
            return []
        claimed = self.claim(free)
        for _ in range(free - len(claimed)):
            self._busy.release()
        return claimed

    def _deliver_and_release(self, claim: Claim) -> None:
        try:
            self.deliver(claim)
        except Exception:
            log.exception("delivering %s failed unexpectedly; its lease will run out",
                          claim.event_id)
        finally:
            self._busy.release()

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
        now = self._clock.now()
        due = select(WebhookEvent.id).where(or_(
            and_(WebhookEvent.status == "pending", WebhookEvent.next_attempt_at <= now),
            and_(WebhookEvent.status == "delivering", WebhookEvent.lease_until <= now),
        )).order_by(WebhookEvent.next_attempt_at).limit(limit)
        if self._engine.dialect.name == "postgresql":
            due = due.with_for_update(skip_locked=True)
        with self._sessions.begin() as session:
            rows = session.execute(
                update(WebhookEvent).where(WebhookEvent.id.in_(due.scalar_subquery()))
                .values(status="delivering", lease_until=now + LEASE,
                        attempts=WebhookEvent.attempts + 1)
                .returning(WebhookEvent.id, WebhookEvent.attempts)
                .execution_options(synchronize_session=False)).all()
        return [Claim(event_id, attempt) for event_id, attempt in rows]

    # --- one attempt -----------------------------------------------------------------

    def deliver(self, claim: Claim) -> Result:
        """Send one claimed event and record what happened."""
        with self._sessions() as session:
            event = session.get(WebhookEvent, claim.event_id)
            assert event is not None
            client = session.get(Client, event.client_id)
            assert client is not None
            secrets = current_webhook_secrets(session, self._clock, self._keyring, client)
            url = client.webhook_url
        started = self._clock.now()
        if not url:
            result = Result(False, None, 0, "the client has no webhook URL")
        else:
            result = self._send(url, secrets, event)
        self._record(claim, started, result)
        return result

    def _send(self, url: str, secrets: list[str], event: WebhookEvent) -> Result:
        # Signed at send time: each attempt carries a fresh timestamp, so a
        # receiver's replay window never rejects a late retry.
        timestamp = int(self._clock.now().timestamp())
        headers = signing.headers(secrets, event.id, timestamp, event.body)
        headers["Content-Type"] = "application/json"
        headers["User-Agent"] = "gateway-webhooks/1"
        begun = time.monotonic()
        try:
            response = self._session().post(url, data=event.body.encode(), headers=headers,
                                            timeout=SEND_TIMEOUT_SECONDS,
                                            allow_redirects=False)
        except BlockedDestination as error:
            return Result(False, None, _elapsed(begun), str(error))
        except requests.RequestException as error:
            return Result(False, None, _elapsed(begun), _describe(error))
        response.close()
        status = response.status_code
        if 200 <= status < 300:
            return Result(True, status, _elapsed(begun), None)
        return Result(False, status, _elapsed(begun), f"answered {status}",
                      _retry_after(response.headers.get("Retry-After"), self._clock.now()))

    def _session(self) -> requests.Session:
        # One keep-alive session per sending thread.
        session: requests.Session | None = getattr(self._http, "session", None)
        if session is None:
            session = guarded_session(self._policy)
            self._http.session = session
        return session

    def _record(self, claim: Claim, started: datetime, result: Result) -> None:
        now = self._clock.now()
        values: dict[str, object]
        if result.delivered:
            values = {"status": "delivered", "delivered_at": now, "lease_until": None,
                      "last_error": None}
        elif claim.attempt >= len(SCHEDULE):
            values = {"status": "dead", "lease_until": None, "last_error": result.error}
        else:
            wait = delay_before(claim.attempt + 1, self._rng)
            if result.retry_after is not None:
                wait = max(wait, min(result.retry_after, MAX_RETRY_AFTER))
            values = {"status": "pending", "next_attempt_at": now + wait, "lease_until": None,
                      "last_error": result.error}
        with self._sessions.begin() as session:
            # Only while the claim is still ours: a worker whose lease ran out
            # must not overwrite the outcome of the one that took over.
            taken = session.execute(update(WebhookEvent).where(
                WebhookEvent.id == claim.event_id, WebhookEvent.status == "delivering",
                WebhookEvent.attempts == claim.attempt).values(**values)
                .execution_options(synchronize_session=False))
            session.add(WebhookAttempt(
                event_id=claim.event_id, number=claim.attempt, started_at=started,
                status_code=result.status_code, latency_ms=result.latency_ms,
                outcome="delivered" if result.delivered else "failed",
                error=(result.error or "")[:500] or None))
            if taken.rowcount != 1:  # type: ignore[attr-defined]
                log.warning("the lease on %s ran out during attempt %d", claim.event_id,
                            claim.attempt)


def _elapsed(begun: float) -> int:
    return round((time.monotonic() - begun) * 1000)


def _describe(error: requests.RequestException) -> str:
    if isinstance(error, requests.Timeout):
        return "timed out"
    if isinstance(error, requests.TooManyRedirects):
        return "answered with a redirect"
    if isinstance(error, requests.ConnectionError):
        return "connection failed"
    return type(error).__name__


def _retry_after(value: str | None, now: datetime) -> timedelta | None:
    """Retry-After as seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    if value.strip().isdigit():
        return timedelta(seconds=int(value.strip()))
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        return None
    return max(moment - now, timedelta(0))
