"""The login lockout: attempts counted in the database, per account and per address.

``GATEWAY_RATELIMIT_LOGIN`` (Flask-Limiter notation, "10 per 15 minutes")
allows that many attempts per account and per address in a fixed window
that opens with the first attempt. Every attempt reserves its place in both
windows before its password is checked, in a transaction of its own that
commits at once; a login that succeeds gives its place back, so the windows
hold failures only, and users behind one shared address (an office) do not
lock each other out by logging in. Counting only failures after their answer
would let guesses sent at once all pass a limit none of them had yet been
counted against, the right one among them. Past the limit every attempt is
refused until the window ends, the right password included: otherwise the
refusals would tell a guesser when it hit.

The counters are rows, so every worker and every instance on one database
shares them, with nothing else to run. A reservation is one conditional
upsert per key: it opens a new window over an ended one, adds one below the
limit, and changes nothing at the limit. On SQLite it runs under the one
writer's lock; on PostgreSQL ``ON CONFLICT DO UPDATE`` locks the row and
evaluates its condition on the row's newest version. Either way no two
attempts can take the last place.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, cast

from limits import parse
from sqlalchemy import Connection, Table, bindparam, case, delete, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from gateway.db import UTCDateTime
from gateway.errors import GatewayError
from gateway.identity.models import LoginCounter
from gateway.settings import Secret, Settings
from gateway.tokens import keyed_digest

ACCOUNT_SCOPE: Final = "login-account"
ADDRESS_SCOPE: Final = "login-ip"
# As Flask-Limiter's login keys were: case-folded, so "Alice" and "alice"
# share one budget, and no longer than a user name may be.
ACCOUNT_KEY_LENGTH: Final = 64

counters = cast(Table, LoginCounter.__table__)


class LockedOut(GatewayError):
    """Too many attempts for this account or this address in the current window."""

    status = 429
    code = "too-many-requests"
    title = "Too many requests"

    def __init__(self, scope: str, retry_after: int) -> None:
        super().__init__("Too many failed logins. Wait a few minutes, then try again.")
        self.scope = scope
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


def _reserve(insert: Callable[..., Any]) -> Any:
    """The reservation upsert, in the insert construct of one dialect; the rule written once."""
    ended = counters.c.window_start <= bindparam("window_ended_before", type_=UTCDateTime)
    statement = insert(counters).values(key=bindparam("counter_key"),
                                        window_start=bindparam("now", type_=UTCDateTime),
                                        attempts=1)
    return statement.on_conflict_do_update(
        index_elements=[counters.c.key],
        set_={"window_start": case((ended, statement.excluded.window_start),
                                   else_=counters.c.window_start),
              "attempts": case((ended, 1), else_=counters.c.attempts + 1)},
        # At the limit the row is left as it is and no row comes back.
        where=or_(ended, counters.c.attempts < bindparam("limit")),
    ).returning(counters.c.window_start)


# The same rule in each dialect's own upsert construct: SQLAlchemy has no
# dialect-neutral one, and both take the same arguments.
RESERVE: Final = {"postgresql": _reserve(postgresql.insert), "sqlite": _reserve(sqlite.insert)}
WINDOW_OF: Final = select(counters.c.window_start).where(
    counters.c.key == bindparam("counter_key"))
# Only into the window that counted it: giving back into a later window
# would credit that one with an extra guess.
GIVE_BACK: Final = update(counters).where(
    counters.c.key == bindparam("counter_key"),
    counters.c.window_start == bindparam("reserved_in", type_=UTCDateTime),
    counters.c.attempts > 0,
).values(attempts=counters.c.attempts - 1)
FORGET_ENDED: Final = delete(counters).where(
    counters.c.window_start <= bindparam("window_ended_before", type_=UTCDateTime))


# Who begins and ends the reservation's transaction: the request's unit of
# work, or a connection's ``begin`` in a command or a test.
Transaction = Callable[[], AbstractContextManager[Session | Connection]]


@dataclass(frozen=True, slots=True)
class Reservation:
    """The places one attempt holds: each counter's key and the window it counted in."""

    places: tuple[tuple[str, datetime], ...]


class Lockout:
    """The login limit of these settings, and the keyed digests its counters go under."""

    def __init__(self, rate: str, pepper: Secret) -> None:
        limit = parse(rate)
        self.limit = limit.amount
        self.window = timedelta(seconds=limit.get_expiry())
        self._pepper = pepper

    @classmethod
    def from_settings(cls, settings: Settings) -> Lockout:
        """The lockout that ``GATEWAY_RATELIMIT_LOGIN`` describes."""
        return cls(settings.ratelimit_login, settings.token_pepper)

    def keys(self, username: str, address: str) -> tuple[tuple[str, str], ...]:
        """Each scope with the digest of what it counts (never the name or the address)."""
        account = username.strip().lower()[:ACCOUNT_KEY_LENGTH]
        return ((ACCOUNT_SCOPE, keyed_digest(self._pepper, f"{ACCOUNT_SCOPE}:{account}")),
                (ADDRESS_SCOPE, keyed_digest(self._pepper, f"{ADDRESS_SCOPE}:{address}")))

    def reserve(self, transaction: Transaction, now: datetime, *, username: str,
                address: str) -> Reservation:
        """Take a place for this attempt in the account's and the address's windows.

        In a ``transaction`` of its own, committed on return: every worker and
        instance sees the place before this attempt's password is checked, and
        the check, which is slow by design, holds no lock. Raises
        :class:`LockedOut` when either window is full, having rolled back, so a
        refused attempt takes no place in the other either.
        """
        with transaction() as db:
            upsert = RESERVE[_dialect(db)]
            places: list[tuple[str, datetime]] = []
            for scope, key in self.keys(username, address):
                window = db.execute(upsert, {"counter_key": key, "now": now,
                                             "limit": self.limit,
                                             "window_ended_before": now - self.window}
                                    ).scalar_one_or_none()
                if window is None:
                    raise LockedOut(scope, self._seconds_left(db, key, now))
                places.append((key, window))
        return Reservation(tuple(places))

    def give_back(self, db: Session | Connection, reservation: Reservation) -> None:
        """Return the places of an attempt that succeeded."""
        db.execute(GIVE_BACK, [{"counter_key": key, "reserved_in": window}
                               for key, window in reservation.places])

    def forget_ended(self, db: Session | Connection, now: datetime) -> int:
        """Delete the counters whose window has ended; how many there were."""
        result: Any = db.execute(FORGET_ENDED, {"window_ended_before": now - self.window})
        return int(result.rowcount)

    def _seconds_left(self, db: Session | Connection, key: str, now: datetime) -> int:
        started = db.execute(WINDOW_OF, {"counter_key": key}).scalar_one()
        # At least a second, as Flask-Limiter words it.
        return max(1, int((started + self.window - now).total_seconds()))


def _dialect(db: Session | Connection) -> str:
    bind: Any = db.get_bind() if isinstance(db, Session) else db
    name: str = bind.dialect.name
    return name

