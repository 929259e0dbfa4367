"""The audit trail's guard also stops a REPLACE, and every other insert over a record.

On SQLite, ``INSERT OR REPLACE`` (and ``REPLACE INTO``) resolves a clash on the
primary key by deleting the old row, and that delete fires no delete trigger
unless the connection turned ``recursive_triggers`` on: it rewrote a record
past the guard of 0006. A trigger before every insert now refuses one whose id
is already taken, whatever the conflict clause says, so the guard no longer
depends on how a connection was set up.

An UPSERT (``INSERT … ON CONFLICT DO UPDATE``) goes through the update
trigger of 0006 on both databases, and on PostgreSQL, which has no REPLACE, a
plain insert over a record fails on the primary key. TRUNCATE is refused on
PostgreSQL since 0006. What no trigger can stop, a role that owns the table
dropping or disabling the guard, is said in docs/security.md.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# A BEFORE INSERT trigger runs before SQLite resolves the conflict, so the old
# row is still there to be seen. A new record's id is not yet assigned then
# (NEW.id reads -1), which matches no row: ordinary inserts pass.
SQLITE_UPGRADE = """
    CREATE TRIGGER audit_events_no_replace BEFORE INSERT ON audit_events
    WHEN EXISTS (SELECT 1 FROM audit_events WHERE id = NEW.id)
    BEGIN
        SELECT RAISE(ABORT, 'audit_events is append-only: REPLACE refused');
    END
"""
SQLITE_DOWNGRADE = "DROP TRIGGER audit_events_no_replace"


def upgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        op.execute(SQLITE_UPGRADE)


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        op.execute(SQLITE_DOWNGRADE)
