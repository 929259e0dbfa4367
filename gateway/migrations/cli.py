"""``gateway db``: schema migrations."""

from __future__ import annotations

import click
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from gateway import cli, migrations
from gateway.audit import service as audit
from gateway.clock import SystemClock
from gateway.db import make_engine


@click.group(cls=cli.Group)
def db() -> None:
    """Database schema."""


@db.command()
def upgrade() -> None:
    """Migrate the database to the schema of this version."""
    settings = cli.settings()
    if settings.database_is_sqlite:
        settings.instance_path.mkdir(parents=True, exist_ok=True, mode=0o700)
    engine = make_engine(settings.database_url)
    try:
        before = migrations.current_revisions(engine)
        migrations.upgrade(engine)
        after = migrations.current_revisions(engine)
        if before != after:
            _record_upgrade(engine, before, after)
    except SQLAlchemyError as error:
        cli.fail(f"database {engine.url.render_as_string(hide_password=True)}: "
                 f"{error.__class__.__name__}: {error.orig if hasattr(error, 'orig') else error}")
    finally:
        engine.dispose()
    if before == after:
        click.echo(f"database is current ({', '.join(sorted(after))})")
    else:
        click.echo(f"database upgraded from {', '.join(sorted(before)) or 'empty'} "
                   f"to {', '.join(sorted(after))}")


def _record_upgrade(engine: Engine, before: set[str], after: set[str]) -> None:
    # Written once the migrations have committed: before them there may be no
    # audit table to write to.
    with sessionmaker(engine).begin() as session:
        audit.record(session, SystemClock(), actor=cli.operator(), action="db.upgraded",
                     target=", ".join(sorted(after)),
                     details={"from": sorted(before), "to": sorted(after)})


@db.command()
def current() -> None:
    """Show the database's schema revision and whether it is current."""
    settings = cli.settings()
    engine = make_engine(settings.database_url)
    try:
        revisions = migrations.current_revisions(engine)
    except SQLAlchemyError as error:
        cli.fail(f"database unreachable: {error.__class__.__name__}")
    finally:
        engine.dispose()
    state = "current" if revisions == migrations.head_revisions() else "needs `gateway db upgrade`"
    click.echo(f"{', '.join(sorted(revisions)) or 'empty'} ({state})")
