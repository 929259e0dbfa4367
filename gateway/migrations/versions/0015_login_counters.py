"""The login lockout counts in the database, shared by every worker and instance.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gateway.db import UTCDateTime

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "login_counters",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("window_start", UTCDateTime(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_login_counters")),
    )
    with op.batch_alter_table("login_counters") as table:
        table.create_index(table.f("ix_login_counters_window_start"), ["window_start"])


def downgrade() -> None:
    with op.batch_alter_table("login_counters") as table:
        table.drop_index(table.f("ix_login_counters_window_start"))
    op.drop_table("login_counters")
