"""Worker heartbeats: when each running dispatcher last looked for due events.

``/readyz`` and ``gateway status`` read them to tell a dead or stuck worker
(events overdue, nobody looking) from a busy one.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gateway.db import UTCDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_heartbeats",
        sa.Column("id", sa.String(length=100), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("polled_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_worker_heartbeats")),
    )
    op.create_index(op.f("ix_worker_heartbeats_polled_at"), "worker_heartbeats", ["polled_at"])


def downgrade() -> None:
    op.drop_table("worker_heartbeats")
