"""Local users and browser sessions; captured credentials.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gateway.db import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("password_changed_at", UTCDateTime(), nullable=False),
        sa.Column("disabled_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("username", name=op.f("uq_users_username")),
    )
    op.create_table(
        "browser_sessions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("subject_iss", sa.String(length=500), nullable=True),
        sa.Column("subject_sub", sa.String(length=255), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("last_seen_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_browser_sessions")),
        sa.UniqueConstraint("digest", name=op.f("uq_browser_sessions_digest")),
    )
    op.create_index(op.f("ix_browser_sessions_last_seen_at"), "browser_sessions",
                    ["last_seen_at"])
    op.create_index("ix_browser_sessions_subject", "browser_sessions",
                    ["subject_iss", "subject_sub"])
    op.create_table(
        "credentials",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("client_id", sa.String(length=40), nullable=False),
        sa.Column("subject_iss", sa.String(length=500), nullable=False),
        sa.Column("subject_sub", sa.String(length=255), nullable=False),
        sa.Column("type", sa.String(length=50), nullable=False),
        sa.Column("hint", sa.String(length=20), nullable=False),
        sa.Column("elicitation_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.Column("key_version", sa.Integer(), nullable=False),
        sa.Column("wrapped_key", sa.LargeBinary(length=128), nullable=False),
        sa.Column("nonce", sa.LargeBinary(length=12), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["client_id"], ["clients.id"],
                                name=op.f("fk_credentials_client_id_clients")),
        sa.ForeignKeyConstraint(["elicitation_id"], ["elicitations.id"],
                                name=op.f("fk_credentials_elicitation_id_elicitations")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_credentials")),
        sa.UniqueConstraint("elicitation_id", name=op.f("uq_credentials_elicitation_id")),
    )
    op.create_index(op.f("ix_credentials_key_version"), "credentials", ["key_version"])
    op.create_index("ix_credentials_owner", "credentials",
                    ["client_id", "subject_iss", "subject_sub", "type"])


def downgrade() -> None:
    op.drop_table("credentials")
    op.drop_table("browser_sessions")
    op.drop_table("users")
