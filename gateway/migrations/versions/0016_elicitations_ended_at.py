"""Elicitations by when they ended: what the long-poll watcher and the metrics ask.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-08
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("elicitations") as table:
        table.create_index(table.f("ix_elicitations_ended_at"), ["ended_at"])


def downgrade() -> None:
    with op.batch_alter_table("elicitations") as table:
        table.drop_index(table.f("ix_elicitations_ended_at"))
