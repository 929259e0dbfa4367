"""The state store: a state is single use, for one browser, for 15 minutes at most."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.clients.models import Client
from gateway.clock import FixedClock
from gateway.elicitations.models import Elicitation
from gateway.elicitations.service import WrongAccount
from gateway.oauth import states
from gateway.oauth.models import OAuthState
from gateway.settings import Secret

START = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PEPPER = Secret("state-store-test-pepper-" + "p" * 24)
ALICES_BROWSER = "a" * 64
BOBS_BROWSER = "b" * 64


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(START)


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with sessionmaker(engine, expire_on_commit=False)() as session:
        session.add(Client(id="cl_test", name="test", status="active", credential_types=[],
                           created_at=START))
        session.add(Elicitation(
            id="el_connect", client_id="cl_test", subject_iss="https://auth.example.com",
            subject_sub="alice", kind="oauth", credential_type="example", scopes=["repo"],
            message="m", metadata_={}, status="opened", created_at=START,
            expires_at=START + timedelta(minutes=15), opened_at=START))
        session.commit()
        yield session


def issued(session: Session, clock: FixedClock) -> str:
    elicitation = session.get(Elicitation, "el_connect")
    assert elicitation is not None
    state = states.issue(session, clock, PEPPER, elicitation, ALICES_BROWSER)
    session.commit()
    return state


def test_a_state_carries_256_random_bits_and_only_its_digest_is_stored(
    session: Session, clock: FixedClock,
) -> None:
    first, second = issued(session, clock), issued(session, clock)
    assert first != second
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", first)  # 32 bytes, URL-safe base64
    stored = [row.digest for row in session.scalars(select(OAuthState))]
    assert len(stored) == 2
    assert first not in stored
    assert second not in stored


def test_it_is_claimed_once_by_its_own_browser(session: Session, clock: FixedClock) -> None:
    state = issued(session, clock)
    assert states.claim(session, clock, PEPPER, state, ALICES_BROWSER).id == "el_connect"
    session.commit()
    with pytest.raises(states.CallbackRefused, match="used already"):
        states.claim(session, clock, PEPPER, state, ALICES_BROWSER)


def test_another_browser_is_refused_and_leaves_it_usable(
    session: Session, clock: FixedClock,
) -> None:
    state = issued(session, clock)
    for browser in (BOBS_BROWSER, None):
        with pytest.raises(WrongAccount):
            states.claim(session, clock, PEPPER, state, browser)
    assert states.claim(session, clock, PEPPER, state, ALICES_BROWSER).id == "el_connect"


@pytest.mark.parametrize("state", ["", "made-up", "x" * 5000])
def test_a_state_not_issued_here_is_refused(session: Session, clock: FixedClock,
                                            state: str) -> None:
    issued(session, clock)
    with pytest.raises(states.CallbackRefused, match="does not belong"):
        states.claim(session, clock, PEPPER, state, ALICES_BROWSER)


def test_it_expires_with_its_link_and_is_then_forgotten(
    session: Session, clock: FixedClock,
) -> None:
    state = issued(session, clock)
    clock.advance(minutes=15)
    with pytest.raises(states.CallbackRefused, match="expired"):
        states.claim(session, clock, PEPPER, state, ALICES_BROWSER)
    assert states.forget_expired(session, clock) == 1
    assert session.scalars(select(OAuthState)).all() == []


def test_a_long_lived_link_gives_its_state_15_minutes_from_the_press_of_connect(
    session: Session, clock: FixedClock,
) -> None:
    elicitation = session.get(Elicitation, "el_connect")
    assert elicitation is not None
    elicitation.expires_at = START + timedelta(days=7)
    session.commit()
    clock.advance(hours=2)  # the user opened the link, then pressed Connect later
    state = issued(session, clock)
    [row] = session.scalars(select(OAuthState)).all()
    assert row.expires_at == START + timedelta(hours=2, minutes=15)
    clock.advance(minutes=14, seconds=59)
    assert states.claim(session, clock, PEPPER, state, ALICES_BROWSER).id == "el_connect"
    session.rollback()  # unused again, to try it a second later
    clock.advance(seconds=1)
    with pytest.raises(states.CallbackRefused, match="expired"):
        states.claim(session, clock, PEPPER, state, ALICES_BROWSER)


def test_a_link_that_ends_sooner_ends_its_state_with_it(
    session: Session, clock: FixedClock,
) -> None:
    clock.advance(minutes=10)
    issued(session, clock)
    [row] = session.scalars(select(OAuthState)).all()
    assert row.expires_at == START + timedelta(minutes=15)


def test_the_verifier_and_nonce_follow_from_the_state_and_the_key_alone() -> None:
    derived = states.derived(PEPPER, "some-state")
    assert derived == states.derived(PEPPER, "some-state")
    assert derived != states.derived(Secret("another-pepper-" + "q" * 30), "some-state")
    assert derived != states.derived(PEPPER, "other-state")
    # RFC 7636: 43 to 128 characters of its unreserved alphabet.
    assert re.fullmatch(r"[A-Za-z0-9._~-]{43,128}", derived.verifier)
    assert derived.nonce not in derived.verifier
