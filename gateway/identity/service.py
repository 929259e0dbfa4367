"""Local accounts and logging in: the rules, apart from any page or command.

A local user's subject is (the gateway's public URL, username): the MCP
server passes exactly that pair when its users log in here.
"""

from __future__ import annotations

import re
from typing import Final

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.clock import Clock
from gateway.errors import Conflict, InvalidInput, NotFound
from gateway.identity import passwords
from gateway.identity.models import BrowserSession, User
from gateway.identity.sessions import Subject

USERNAME: Final = re.compile(r"[a-z0-9][a-z0-9._@-]{0,63}")


def local_subject(public_url: str, username: str) -> Subject:
    """The subject of a local account."""
    return Subject(public_url, username)


def create_user(session: Session, clock: Clock, *, username: str, password: str,
                actor: str) -> User:
    """Add a local account."""
    if not USERNAME.fullmatch(username):
        raise InvalidInput("a username is 1 to 64 lower-case letters, digits, '.', '_', '@' "
                           "or '-', starting with a letter or digit")
    if session.scalar(select(User.id).where(User.username == username)) is not None:
        raise Conflict(f"a user named {username!r} exists already")
    password_hash = _hash(password)
    now = clock.now()
    user = User(username=username, password_hash=password_hash, status="active",
                created_at=now, password_changed_at=now)
    session.add(user)
    audit.record(session, clock, actor=actor, action="user.created", target=username)
    return user


def get_user(session: Session, username: str) -> User:
    user = session.scalar(select(User).where(User.username == username))
    if user is None:
        raise NotFound(f"no user {username!r}")
    return user


def list_users(session: Session) -> list[User]:
    return list(session.scalars(select(User).order_by(User.username)))


def disable_user(session: Session, clock: Clock, *, username: str, public_url: str,
                 actor: str) -> int:
    """Disable an account and end its sessions at once; how many sessions ended."""
    user = get_user(session, username)
    if not user.active:
        raise Conflict(f"user {username!r} is disabled already")
    user.status = "disabled"
    user.disabled_at = clock.now()
    ended = end_sessions(session, local_subject(public_url, username))
    audit.record(session, clock, actor=actor, action="user.disabled", target=username,
                 details={"sessions_ended": ended})
    return ended


def reset_password(session: Session, clock: Clock, *, username: str, password: str,
                   public_url: str, actor: str) -> None:
    """Set a new password; the user's sessions end, so the old one is no way back in."""
    user = get_user(session, username)
    user.password_hash = _hash(password)
    user.password_changed_at = clock.now()
    ended = end_sessions(session, local_subject(public_url, username))
    audit.record(session, clock, actor=actor, action="user.password_reset", target=username,
                 details={"sessions_ended": ended})


def end_subject_sessions(session: Session, clock: Clock, *, subject: Subject,
                         actor: str) -> int:
    """End every browser session of ``subject``, whichever backend logged it in; how many.

    The only way to log out an OpenID Connect user from here: such a user
    has no local account to disable, and logs in again only if the
    provider still lets them.
    """
    if not subject.iss or not subject.sub:
        raise InvalidInput("a subject needs both an issuer and a sub")
    ended = end_sessions(session, subject)
    audit.record(session, clock, actor=actor, action="user.sessions_ended", target=subject.sub,
                 details={"iss": subject.iss, "sessions_ended": ended})
    return ended


def end_sessions(session: Session, subject: Subject) -> int:
    """Delete every browser session of ``subject``."""
    result = session.execute(delete(BrowserSession).where(
        BrowserSession.subject_iss == subject.iss, BrowserSession.subject_sub == subject.sub))
    return result.rowcount or 0  # type: ignore[attr-defined]


def check_local_login(session: Session, clock: Clock, *, username: str, password: str,
                      source_ip: str | None) -> User | None:
    """The active user with this password; None after auditing the failure (no password).

    A failure returns rather than raises, so the caller commits its audit row.
    """
    name = username.strip().lower()
    # A name no account can have is not looked up: PostgreSQL refuses a NUL
    # in a query's text, and the attempt must fail as any other would.
    user = session.scalar(select(User).where(User.username == name)) \
        if USERNAME.fullmatch(name) else None
    valid = passwords.verify_password(user.password_hash if user else None, password)
    if user is None or not valid or not user.active:
        reason = "unknown user" if user is None else \
            "wrong password" if not valid else "disabled user"
        audit.record(session, clock, actor=f"anonymous@{source_ip or 'unknown'}",
                     action="login.failed", outcome="failure",
                     target=username[:64].replace("\x00", "\ufffd"),
                     source_ip=source_ip, details={"reason": reason, "backend": "local"})
        return None
    if passwords.needs_rehash(user.password_hash):
        user.password_hash = passwords.HASHER.hash(password)
    return user


def _hash(password: str) -> str:
    try:
        return passwords.hash_password(password)
    except passwords.WeakPassword as error:
        raise InvalidInput(str(error)) from None
