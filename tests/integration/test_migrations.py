"""Migrations: up from empty on this run's backend, and in step with the models."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from flask import Flask
from sqlalchemy import delete, inspect, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway import db, migrations
from gateway.app import create_app
from gateway.clients.models import Client, WebhookSecret
from gateway.credentials.models import Credential
from gateway.elicitations.models import Elicitation
from gateway.settings import Settings
from gateway.vault.envelope import Envelope
from gateway.vault.models import KeyVersion
from tests.conftest import client_for


def test_upgrade_from_empty_reaches_head(empty_database_url: str) -> None:
    engine = db.make_engine(empty_database_url)
    try:
        assert migrations.current_revisions(engine) == set()
        migrations.upgrade(engine)
        assert migrations.is_current(engine)
        assert "audit_events" in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_models_and_migrations_agree(database_url: str) -> None:
    engine = db.make_engine(database_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, db.Base.metadata) == []
    finally:
        engine.dispose()


def test_downgrade_to_base_and_back(empty_database_url: str) -> None:
    engine = db.make_engine(empty_database_url)
    try:
        migrations.upgrade(engine)
        command.downgrade(migrations.alembic_config(engine), "base")
        assert "audit_events" not in inspect(engine).get_table_names()
        migrations.upgrade(engine)
        assert migrations.is_current(engine)
    finally:
        engine.dispose()


def test_sqlite_runs_with_wal_and_foreign_keys(app: Flask, settings: Settings) -> None:
    if not settings.database_is_sqlite:
        return
    with app.app_context(), db.engine().connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1


def test_readyz_reports_pending_migrations(make_settings: Callable[..., Settings],
                                           empty_database_url: str) -> None:
    app = create_app(make_settings(GATEWAY_DATABASE_URL=empty_database_url))
    response = client_for(app).get("/readyz")
    assert response.status_code == 503
    assert response.get_json() == {"status": "unavailable", "database": "ok",
                                   "migrations": "pending"}
    app.extensions["gateway.engine"].dispose()


def test_readyz_reports_an_unreachable_database(make_settings: Callable[..., Settings],
                                                ) -> None:
    app = create_app(make_settings(
        GATEWAY_DATABASE_URL="sqlite:////nonexistent-folder/for/sure/gateway.db"))
    response = client_for(app).get("/readyz")
    assert response.status_code == 503
    assert response.get_json()["database"] == "unreachable"


def test_readyz_is_ready_on_a_migrated_database(app: Flask) -> None:
    assert client_for(app).get("/readyz").get_json() == {
        "status": "ready", "database": "ok", "migrations": "current"}


def test_sealed_rows_come_to_refer_to_their_key_version_with_their_data(
    empty_database_url: str,
) -> None:
    # A deployment at 0011 that never rotated: secrets sealed under its
    # keyring's v3, nothing in key_versions.
    engine = db.make_engine(empty_database_url)
    now = datetime.now(UTC)
    envelope = Envelope(3, b"w" * 60, b"n" * 12, b"c" * 40)
    try:
        migrations.upgrade(engine, "0011")
        with Session(engine) as session, session.begin():
            session.add(Client(id="cl_1", name="one", status="active", credential_types=[],
                               created_at=now))
            session.flush()
            session.add(Elicitation(
                id="el_1", client_id="cl_1", subject_iss="https://i", subject_sub="u",
                kind="api_key", credential_type="generic", message="m", metadata_={},
                status="completed", created_at=now, expires_at=now))
            session.flush()
            credential = Credential(id="cr_1", client_id="cl_1", subject_iss="https://i",
                                    subject_sub="u", type="generic", hint="…",
                                    created_at=now, elicitation_id="el_1")
            secret = WebhookSecret(id="whs_1", client_id="cl_1", created_at=now)
            credential.envelope = secret.envelope = envelope
            session.add_all([credential, secret])

        migrations.upgrade(engine)

        with Session(engine) as session:
            [listed] = session.scalars(select(KeyVersion)).all()
            assert (listed.version, listed.carried_over) == (3, False)
            stored = session.get(Credential, "cr_1")
            assert stored is not None
            assert stored.envelope == envelope  # nothing rewritten
        for table in ("credentials", "webhook_secrets"):
            [foreign_key] = [fk for fk in inspect(engine).get_foreign_keys(table)
                             if fk["referred_table"] == "key_versions"]
            assert foreign_key["constrained_columns"] == ["key_version"]
        # The version in use cannot go.
        with pytest.raises(IntegrityError), engine.begin() as connection:
            connection.execute(delete(KeyVersion).where(KeyVersion.version == 3))
        command.downgrade(migrations.alembic_config(engine), "0011")
        with Session(engine) as session:
            assert session.scalars(select(KeyVersion)).all() == []
    finally:
        engine.dispose()
