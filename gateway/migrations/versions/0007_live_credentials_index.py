"""An index of the live credentials of each owner (client, subject and type).

A capture revokes the owner's live credential before it stores the new one.
The owner index also holds every credential revoked before, so that lookup
read a row per key the user ever replaced; this partial index holds only the
live ones, at most one per owner, and makes it a single index probe.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_LIVE = sa.text("revoked_at IS NULL")


def upgrade() -> None:
    op.create_index("ix_credentials_live_owner", "credentials",
                    ["client_id", "subject_iss", "subject_sub", "type"],
                    sqlite_where=_LIVE, postgresql_where=_LIVE)


def downgrade() -> None:
    op.drop_index("ix_credentials_live_owner", table_name="credentials")
