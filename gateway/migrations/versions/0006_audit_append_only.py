"""The audit trail becomes append-only, enforced by the database.

Triggers refuse every UPDATE and DELETE of an ``audit_events`` row (and, on
PostgreSQL, TRUNCATE), whichever code path or SQL statement tries: a bug or an
injected statement in the application cannot rewrite history. The refusal is
an integrity error on both backends, with "append-only" in its message.

A role that owns the table can still lift the guard (``ALTER TABLE … DISABLE
TRIGGER`` on PostgreSQL, ``DROP TRIGGER`` on SQLite); the application never
does. On SQLite, a later migration that rebuilds ``audit_events`` in batch mode
drops these triggers with the old table and must create them again.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# SQLSTATE 23001 (restrict_violation): drivers raise an integrity error, as
# SQLite does for RAISE(ABORT) in a trigger.
POSTGRESQL_UPGRADE = [
    """
    CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'audit_events is append-only: % refused', TG_OP
            USING ERRCODE = 'restrict_violation',
                  HINT = 'audit records are never changed or deleted';
    END
    $$
    """,
    """
    CREATE TRIGGER audit_events_append_only
        BEFORE UPDATE OR DELETE ON audit_events
        FOR EACH ROW EXECUTE FUNCTION audit_events_append_only()
    """,
    # TRUNCATE fires no row triggers; a statement trigger catches it.
    """
    CREATE TRIGGER audit_events_no_truncate
        BEFORE TRUNCATE ON audit_events
        FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only()
    """,
]
POSTGRESQL_DOWNGRADE = [
    "DROP TRIGGER audit_events_no_truncate ON audit_events",
    "DROP TRIGGER audit_events_append_only ON audit_events",
    "DROP FUNCTION audit_events_append_only()",
]

# SQLite has no TRUNCATE: a DELETE without WHERE fires the delete trigger too.
SQLITE_UPGRADE = [
    """
    CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events
    BEGIN
        SELECT RAISE(ABORT, 'audit_events is append-only: UPDATE refused');
    END
    """,
    """
    CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events
    BEGIN
        SELECT RAISE(ABORT, 'audit_events is append-only: DELETE refused');
    END
    """,
]
SQLITE_DOWNGRADE = [
    "DROP TRIGGER audit_events_no_delete",
    "DROP TRIGGER audit_events_no_update",
]


def _run(statements: list[str]) -> None:
    for statement in statements:
        op.execute(statement)


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        _run(POSTGRESQL_UPGRADE)
    else:
        _run(SQLITE_UPGRADE)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        _run(POSTGRESQL_DOWNGRADE)
    else:
        _run(SQLITE_DOWNGRADE)
