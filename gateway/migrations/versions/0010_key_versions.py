"""Key-encryption key versions in the database, and the heartbeats of the processes using them.

Every running process reads the key versions from here, so a rotation
reaches all of them without a restart. Each version is stored sealed by a
root key from the configured keyring. A deployment that never rotated since
this revision has no rows yet: its configured keyring's versions keep
wrapping data keys as before, and the first ``gateway keys rotate`` carries
them over (this migration cannot: it has no key).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gateway.db import UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "key_versions",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("root_version", sa.Integer(), nullable=False),
        sa.Column("wrapped_key", sa.LargeBinary(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_key_versions")),
    )
    op.create_table(
        "vault_instances",
        sa.Column("instance", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=40), nullable=False),
        sa.Column("key_version", sa.Integer(), nullable=False),
        sa.Column("seen_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("instance", name=op.f("pk_vault_instances")),
    )
    op.create_index(op.f("ix_vault_instances_seen_at"), "vault_instances", ["seen_at"])


def downgrade() -> None:
    # The versions go with the table: secrets wrapped by one that is not also
    # in the configured keyring no longer open. Back up the database first.
    op.drop_table("vault_instances")
    op.drop_table("key_versions")
