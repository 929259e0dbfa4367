"""Server-side browser sessions behind a ``__Host-`` cookie.

The cookie holds 256 random bits and nothing else; the database keeps only
their keyed digest, with the subject, the session's data (CSRF token, login
state) and its times. So a copied database logs nobody in, logout and user
disable end a session for good, and the id changes on every login (a cookie
planted before login is worthless after it: no session fixation).

Sessions end after ``session_idle_minutes`` without a request and after
``session_max_hours`` whatever happens.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from flask import Flask, Request, Response
from flask.sessions import SessionInterface, SessionMixin
from sqlalchemy import delete, select, update
from werkzeug.datastructures import CallbackDict

from gateway import db
from gateway.clock import Clock
from gateway.identity.models import BrowserSession
from gateway.settings import Secret, Settings
from gateway.tokens import keyed_digest, new_token

COOKIE_NAME: Final = "__Host-gateway_session"
# last_seen_at is rewritten at most this often: the idle timeout needs no
# better precision, and most requests then write nothing.
TOUCH_EVERY: Final = timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class Subject:
    """A user as an issuer names them."""

    iss: str
    sub: str


class ServerSession(CallbackDict[str, Any], SessionMixin):
    """The session of one request: its data, and who it belongs to."""

    def __init__(self, data: dict[str, Any] | None = None, *, token: str | None = None,
                 subject: Subject | None = None, created_at: datetime | None = None,
                 last_seen_at: datetime | None = None) -> None:
        def changed(_: CallbackDict[str, Any]) -> None:
            self.modified = True

        super().__init__(data or {}, changed)
        self.token = token  # the cookie value; None for a session not stored yet
        self.subject = subject
        self.created_at = created_at
        self.last_seen_at = last_seen_at
        self.modified = False
        self.rotate = False
        self.ended = False

    def log_in(self, subject: Subject) -> None:
        """Bind the session to ``subject`` under a fresh id; everything before is dropped."""
        self.clear()
        self.subject = subject
        self.rotate = True
        self.modified = True

    def end(self) -> None:
        """Log out: the row is deleted and the cookie removed."""
        self.clear()
        self.subject = None
        self.ended = True


class ServerSessionInterface(SessionInterface):
    """Flask's session, kept in the ``browser_sessions`` table."""

    def __init__(self, clock: Clock, settings: Settings) -> None:
        self._clock = clock
        self._pepper: Secret = settings.token_pepper
        self._idle = timedelta(minutes=settings.session_idle_minutes)
        self._lifetime = timedelta(hours=settings.session_max_hours)

    def open_session(self, app: Flask, request: Request) -> ServerSession:
        token = request.cookies.get(COOKIE_NAME)
        if not token:
            return ServerSession()
        # In the request's session: most requests read their session and write nothing.
        row = db.session().execute(_LOOKUP.where(
            BrowserSession.digest == keyed_digest(self._pepper, token))).first()
        if row is None:
            return ServerSession()
        now = self._clock.now()
        if now - row.last_seen_at >= self._idle or now - row.created_at >= self._lifetime:
            self._delete(token)
            return ServerSession()
        subject = Subject(row.subject_iss, row.subject_sub) \
            if row.subject_iss is not None and row.subject_sub is not None else None
        return ServerSession(dict(row.data), token=token, subject=subject,
                             created_at=row.created_at, last_seen_at=row.last_seen_at)

    def save_session(self, app: Flask, session: SessionMixin | None,
                     response: Response) -> None:
        if session is None:
            return  # it could not be opened (the database was away): nothing to save
        assert isinstance(session, ServerSession)
        if session.ended:
            self._delete(session.token)
            if session.token:
                response.delete_cookie(COOKIE_NAME, path="/", secure=True, httponly=True,
                                       samesite="Lax")
            return
        if session.rotate:
            self._delete(session.token)
            session.token = None
        if session.token is None:
            if not session.modified or (not session and session.subject is None):
                return  # nothing worth a row: no cookie for a visitor who stored nothing
            session.token = self._insert(session)
        elif session.modified:
            self._update(session)
        elif session.last_seen_at and self._clock.now() - session.last_seen_at > TOUCH_EVERY:
            self._touch(session.token)
        response.vary.add("Cookie")
        # No Expires: the cookie dies with the browser; the server ends it sooner.
        response.set_cookie(COOKIE_NAME, session.token, path="/", secure=True, httponly=True,
                            samesite="Lax")

    def _insert(self, session: ServerSession) -> str:
        token = new_token("")
        now = self._clock.now()
        with db.transaction() as orm:
            orm.add(BrowserSession(
                digest=keyed_digest(self._pepper, token),
                subject_iss=session.subject.iss if session.subject else None,
                subject_sub=session.subject.sub if session.subject else None,
                data=dict(session), created_at=now, last_seen_at=now))
        return token

    def _update(self, session: ServerSession) -> None:
        assert session.token is not None
        with db.transaction() as orm:
            orm.execute(update(BrowserSession)
                       .where(BrowserSession.digest == keyed_digest(self._pepper, session.token))
                       .values(data=dict(session), last_seen_at=self._clock.now()))

    def _touch(self, token: str) -> None:
        with db.transaction() as orm:
            orm.execute(update(BrowserSession)
                       .where(BrowserSession.digest == keyed_digest(self._pepper, token))
                       .values(last_seen_at=self._clock.now()))

    def _delete(self, token: str | None) -> None:
        if token is None:
            return
        with db.transaction() as orm:
            orm.execute(delete(BrowserSession).where(
                BrowserSession.digest == keyed_digest(self._pepper, token)))


_LOOKUP: Final = select(BrowserSession.subject_iss, BrowserSession.subject_sub,
                        BrowserSession.data, BrowserSession.created_at,
                        BrowserSession.last_seen_at)
