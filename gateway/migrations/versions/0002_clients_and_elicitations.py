"""Clients, their API tokens and webhook secrets; elicitations; idempotency records.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gateway.db import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clients",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("webhook_url", sa.String(length=2000), nullable=True),
        sa.Column("credential_types", sa.JSON(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("disabled_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_clients")),
        sa.UniqueConstraint("name", name=op.f("uq_clients_name")),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("client_id", sa.String(length=40), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("hint", sa.String(length=20), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["client_id"], ["clients.id"],
                                name=op.f("fk_api_tokens_client_id_clients")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("digest", name=op.f("uq_api_tokens_digest")),
    )
    op.create_index(op.f("ix_api_tokens_client_id"), "api_tokens", ["client_id"])
    op.create_table(
        "webhook_secrets",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("client_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("retires_at", UTCDateTime(), nullable=True),
        sa.Column("key_version", sa.Integer(), nullable=False),
        sa.Column("wrapped_key", sa.LargeBinary(length=128), nullable=False),
        sa.Column("nonce", sa.LargeBinary(length=12), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["client_id"], ["clients.id"],
                                name=op.f("fk_webhook_secrets_client_id_clients")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_secrets")),
    )
    op.create_index(op.f("ix_webhook_secrets_client_id"), "webhook_secrets", ["client_id"])
    op.create_index(op.f("ix_webhook_secrets_key_version"), "webhook_secrets", ["key_version"])
    op.create_table(
        "elicitations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("client_id", sa.String(length=40), nullable=False),
        sa.Column("subject_iss", sa.String(length=500), nullable=False),
        sa.Column("subject_sub", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("credential_type", sa.String(length=50), nullable=True),
        sa.Column("payment", sa.JSON(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("opened_at", UTCDateTime(), nullable=True),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["client_id"], ["clients.id"],
                                name=op.f("fk_elicitations_client_id_clients")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_elicitations")),
    )
    op.create_index("ix_elicitations_reuse", "elicitations",
                    ["client_id", "subject_iss", "subject_sub", "kind", "status"])
    op.create_index("ix_elicitations_client_created", "elicitations",
                    ["client_id", "created_at"])
    op.create_index("ix_elicitations_status_expires_at", "elicitations",
                    ["status", "expires_at"])
    op.create_table(
        "idempotency_records",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_digest", sa.String(length=64), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["client_id"], ["clients.id"],
                                name=op.f("fk_idempotency_records_client_id_clients")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_idempotency_records")),
        sa.UniqueConstraint("client_id", "key", name=op.f("uq_idempotency_records_client_id")),
    )
    op.create_index(op.f("ix_idempotency_records_created_at"), "idempotency_records",
                    ["created_at"])


def downgrade() -> None:
    op.drop_table("idempotency_records")
    op.drop_table("elicitations")
    op.drop_table("webhook_secrets")
    op.drop_table("api_tokens")
    op.drop_table("clients")
