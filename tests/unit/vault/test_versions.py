"""Key versions in the database: sealed by the root key, read again when one is unknown, and
new secrets wrapped with a version read less than REFRESH ago, which the process announces."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, text
from sqlalchemy.orm import Session

from gateway.clock import FixedClock
from gateway.vault import versions
from gateway.vault.envelope import bind, reveal_plaintext, seal
from gateway.vault.keyring import Keyring, KeyringError
from gateway.vault.models import KeyVersion, VaultInstance
from gateway.vault.versions import KeyVersions

ROOT = Keyring({1: b"r" * 32})
ROW = bind(credential_id="cr_1", client_id="cl_1")


@pytest.fixture
def store(engine: Engine, clock: FixedClock) -> KeyVersions:
    """The key versions as one process holds them, its root the keyring ``ROOT``."""
    return KeyVersions(engine, lambda: ROOT, clock, role="test")


def rotate(engine: Engine, clock: FixedClock, root: Keyring = ROOT) -> int:
    """What `gateway keys rotate` does, from another process."""
    with Session(engine) as session, session.begin():
        return versions.add_version(session, root, clock.now())


def rows(engine: Engine) -> dict[int, KeyVersion]:
    with Session(engine) as session:
        return versions.stored(session)


@pytest.fixture
def statements(engine: Engine) -> Iterator[list[str]]:
    """The SQL statements sent on ``engine`` from now on."""
    sent: list[str] = []

    def record(*args: Any) -> None:
        sent.append(args[2])

    event.listen(engine, "before_cursor_execute", record)
    yield sent
    event.remove(engine, "before_cursor_execute", record)


def test_before_the_first_rotation_the_keyrings_versions_are_the_keys(
    store: KeyVersions,
) -> None:
    envelope = seal(ROOT, b"sk-sealed-before", ROW)  # as every secret sealed until now
    assert reveal_plaintext(store, envelope, ROW) == b"sk-sealed-before"
    assert store.current_version == 1


def test_a_rotation_carries_the_keyring_over_sealed_by_the_root(
    engine: Engine, clock: FixedClock, store: KeyVersions,
) -> None:
    before = seal(ROOT, b"sk-sealed-before", ROW)
    assert rotate(engine, clock) == 2
    stored = rows(engine)
    assert sorted(stored) == [1, 2]
    assert {row.root_version for row in stored.values()} == {1}
    assert all(ROOT.key(1) not in row.wrapped_key for row in stored.values())
    assert versions.open_version(ROOT, stored[1]) == ROOT.key(1)
    assert versions.open_version(ROOT, stored[2]) != ROOT.key(1)
    assert reveal_plaintext(store, before, ROW) == b"sk-sealed-before"
    assert rotate(engine, clock) == 3


def test_a_stored_version_opens_only_as_itself_and_only_with_its_root(
    engine: Engine, clock: FixedClock,
) -> None:
    rotate(engine, clock)
    stored = rows(engine)
    swapped = KeyVersion(version=1, root_version=1, wrapped_key=stored[2].wrapped_key,
                         created_at=clock.now())
    with pytest.raises(KeyringError, match="v1 does not open with root key v1"):
        versions.open_version(ROOT, swapped)
    with pytest.raises(KeyringError, match="wrong keyring"):
        versions.open_version(Keyring({1: b"s" * 32}), stored[2])
    with pytest.raises(KeyringError, match="root key v1, which is not in the keyring"):
        versions.open_version(Keyring({7: b"s" * 32}), stored[2])


def test_an_unknown_version_is_read_again_and_a_known_one_costs_no_read(
    engine: Engine, clock: FixedClock, store: KeyVersions, statements: list[str],
) -> None:
    store.key(1)
    rotate(engine, clock)  # another process adds v2 and seals with it
    sealed_elsewhere = seal(KeyVersions(engine, lambda: ROOT, clock, role="other"),
                            b"sk-from-elsewhere", ROW)
    assert sealed_elsewhere.key_version == 2
    statements.clear()
    store.key(1)
    assert statements == []
    assert reveal_plaintext(store, sealed_elsewhere, ROW) == b"sk-from-elsewhere"
    assert any("key_versions" in sql for sql in statements)
    statements.clear()
    assert reveal_plaintext(store, sealed_elsewhere, ROW) == b"sk-from-elsewhere"
    assert statements == []


def test_a_version_nowhere_is_refused_after_one_more_read(store: KeyVersions) -> None:
    with pytest.raises(KeyringError, match="v9 is not in the keyring"):
        store.key(9)


def test_new_secrets_are_wrapped_with_a_version_read_less_than_refresh_ago(
    engine: Engine, clock: FixedClock, store: KeyVersions,
) -> None:
    assert store.current_version == 1
    rotate(engine, clock)
    clock.advance(seconds=versions.REFRESH.total_seconds() - 1)
    assert store.current_version == 1
    clock.advance(seconds=1)
    assert store.current_version == 2
    assert seal(store, b"sk-new", ROW).key_version == 2


def test_each_read_before_a_wrap_announces_the_version_wrapped_with(
    engine: Engine, clock: FixedClock, store: KeyVersions,
) -> None:
    assert store.current_version == 1
    with Session(engine) as session:
        [beat] = versions.fresh_heartbeats(session, clock.now())
        assert (beat.role, beat.key_version) == ("test", 1)
    rotate(engine, clock)
    store.refresh()  # as when told
    with Session(engine) as session:
        [beat] = versions.fresh_heartbeats(session, clock.now())
        assert beat.key_version == 2
        later = clock.now() + versions.HEARTBEAT_FRESH
        assert versions.fresh_heartbeats(session, later) == []


def test_a_heartbeat_that_must_wait_is_skipped_and_tried_at_the_next_wrap(
    engine: Engine, clock: FixedClock, store: KeyVersions, clean_database: str,
) -> None:
    if not clean_database.startswith("sqlite"):
        pytest.skip("only SQLite has one lock for the whole database")
    # This process holds the write lock, as a command sealing inside its transaction does.
    with engine.begin() as holding:
        holding.execute(text("DELETE FROM vault_instances WHERE 0 = 1"))
        started = time.monotonic()
        assert store.current_version == 1
        assert time.monotonic() - started < 2
    with Session(engine) as session:
        assert session.scalars(select(VaultInstance)).all() == []
    assert store.current_version == 1  # read again, and announced this time
    with Session(engine) as session:
        assert len(versions.fresh_heartbeats(session, clock.now())) == 1


def test_a_new_root_reseals_every_version_and_the_old_one_is_no_longer_needed(
    engine: Engine, clock: FixedClock,
) -> None:
    rotate(engine, clock)
    both = Keyring({2: b"n" * 32, 1: ROOT.key(1)})
    with Session(engine) as session, session.begin():
        assert versions.reseal_with_newest_root(session, both) == [1, 2]
    with Session(engine) as session, session.begin():
        assert versions.reseal_with_newest_root(session, both) == []
    new_root_only = KeyVersions(engine, lambda: Keyring({2: b"n" * 32}), clock, role="test")
    assert new_root_only.key(1) == ROOT.key(1)
    assert new_root_only.current_version == 2
    assert {row.root_version for row in rows(engine).values()} == {2}


def test_the_store_prints_no_key(engine: Engine, clock: FixedClock, store: KeyVersions) -> None:
    rotate(engine, clock)
    store.key(2)
    assert repr(store) == "KeyVersions(v2, v1)"
    assert repr(store.snapshot()) == "Keyring(v2, v1)"
    assert "r" * 8 not in repr(rows(engine))


def test_the_first_wrap_lists_the_configured_version_for_sealed_rows_to_refer_to(
    engine: Engine, clock: FixedClock, store: KeyVersions,
) -> None:
    assert rows(engine) == {}
    assert store.current_version == 1
    [listed] = rows(engine).values()
    assert (listed.version, listed.carried_over) == (1, False)
    assert seal(store, b"sk-new", ROW).key_version == 1  # the configured key, as before
    # The first rotation carries it over in place, sealed by the root key.
    rotate(engine, clock)
    carried = rows(engine)
    assert sorted(carried) == [1, 2]
    assert all(row.carried_over for row in carried.values())
    assert versions.open_version(ROOT, carried[1]) == ROOT.key(1)
