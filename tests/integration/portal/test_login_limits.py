"""The login lockout: every attempt counted before its password is checked, failures kept."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest
from flask import Flask, request
from sqlalchemy import select
from werkzeug.test import TestResponse

from gateway import db
from gateway.audit.models import AuditEvent
from gateway.clock import FixedClock
from gateway.identity.lockout import Lockout, Reservation, Transaction
from gateway.identity.models import LoginCounter
from gateway.identity.web import LOCKOUT_EXTENSION
from gateway.settings import Settings
from gateway.worker import sweep
from tests.integration.portal.conftest import PASSWORD, Browser, csrf_of
from tests.integration.portal.test_sessions import logged_in

GUESSES = 59
LIMIT = 10  # the default, "10 per 15 minutes"


class Gate:
    """Holds wrong guesses between the limiter's count and the password check."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.settled = threading.Condition()
        self.held = 0
        self.answered = 0

    def note(self, *, held: int = 0, answered: int = 0) -> None:
        with self.settled:
            self.held += held
            self.answered += answered
            self.settled.notify_all()

    def wait_until_settled(self, guesses: int) -> None:
        """Until each guess is either held past the count or answered."""
        with self.settled:
            assert self.settled.wait_for(lambda: self.held + self.answered == guesses,
                                         timeout=60), (self.held, self.answered)


class HeldLockout(Lockout):
    """The app's lockout, holding each wrong guess once its place is reserved."""

    def __init__(self, settings: Settings, gate: Gate) -> None:
        super().__init__(settings.ratelimit_login, settings.token_pepper)
        self.gate = gate

    def reserve(self, transaction: Transaction, now: datetime, *, username: str,
                address: str) -> Reservation:
        reservation = super().reserve(transaction, now, username=username, address=address)
        # The reservation has committed; the password is not checked yet.
        if request.form.get("password") != PASSWORD:
            self.gate.note(held=1)
            self.gate.opened.wait(timeout=60)
        return reservation


@pytest.fixture
def gate(app: Flask, settings: Settings) -> Iterator[Gate]:
    """Holds each wrong guess between its reservation and its password check.

    Holding the guesses there makes "all at once" exact: each has been
    counted, or refused, and none has been answered when the right password
    comes, whatever the threads' timing.
    """
    held = Gate()
    app.extensions[LOCKOUT_EXTENSION] = HeldLockout(settings, held)
    yield held
    held.opened.set()


def test_guesses_sent_at_once_cannot_slip_the_right_password_past_the_limit(
    app: Flask, browser: Callable[[], Browser], alice: str, gate: Gate,
) -> None:
    guessers = [browser() for _ in range(GUESSES)]
    forms = [{"csrf_token": csrf_of(guesser.get("/login")), "username": alice,
              "password": f"guess-number-{number}", "next": "/"}
             for number, guesser in enumerate(guessers)]
    answers: list[TestResponse] = []

    def guess(guesser: Browser, form: dict[str, str]) -> None:
        response = guesser.client.post("/login", data=form)
        answers.append(response)
        gate.note(answered=1)

    threads = [threading.Thread(target=guess, args=pair)
               for pair in zip(guessers, forms, strict=True)]
    for thread in threads:
        thread.start()
    try:
        gate.wait_until_settled(GUESSES)
        owner = browser()
        last = owner.log_in(alice)
    finally:
        gate.opened.set()
        for thread in threads:
            thread.join(timeout=60)

    assert last.status_code == 429
    assert not logged_in(owner)
    assert sorted(answer.status_code for answer in answers) == \
        [401] * LIMIT + [429] * (GUESSES - LIMIT)


def test_a_successful_login_gives_its_count_back(
    browser: Callable[[], Browser], alice: str,
) -> None:
    # Many users behind one address (an office) log in all day long.
    office = browser()
    for _ in range(LIMIT + 2):
        assert office.log_in(alice).status_code == 303
    for _ in range(LIMIT):
        assert office.log_in(alice, password="guess-guess-guess").status_code == 401
    assert office.log_in(alice).status_code == 429


def test_a_nul_in_the_user_name_is_a_failed_login_and_is_counted(
    app: Flask, browser: Callable[[], Browser], alice: str,
) -> None:
    attacker = browser()
    for _ in range(LIMIT):
        response = attacker.log_in("alice\x00", password="guess-guess-guess")
        assert response.status_code == 401
    assert attacker.log_in(alice).status_code == 429
    with app.app_context():
        targets = db.session().scalars(select(AuditEvent.target).where(
            AuditEvent.action == "login.failed")).all()
    assert targets == ["alice\ufffd"] * LIMIT


def test_the_lockout_ends_with_its_window_and_the_sweeper_forgets_it(
    app: Flask, browser: Callable[[], Browser], alice: str, clock: FixedClock,
) -> None:
    attacker = browser()
    for _ in range(LIMIT):
        assert attacker.log_in(alice, password="guess-guess-guess").status_code == 401
    refused = attacker.log_in(alice)
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == str(15 * 60)
    clock.advance(minutes=15)
    with app.app_context():
        sweep(db.engine_of(app), clock, app.extensions[LOCKOUT_EXTENSION])
        assert db.session().scalars(select(LoginCounter)).all() == []
    assert attacker.log_in(alice).status_code == 303
