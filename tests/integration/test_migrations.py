"""Migrations: up from empty on this run's backend, and in step with the models."""

from __future__ import annotations

from collections.abc import Callable

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from flask import Flask
from sqlalchemy import inspect, text

from gateway import db, migrations
from gateway.app import create_app
from gateway.settings import Settings
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
