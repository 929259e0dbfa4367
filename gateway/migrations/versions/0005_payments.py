"""Stripe Checkout Sessions of payment elicitations; Stripe events already handled.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gateway.db import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "payments",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("elicitation_id", sa.String(length=40), nullable=False),
        sa.Column("client_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("checkout_session_id", sa.String(length=255), nullable=False),
        sa.Column("checkout_url", sa.String(length=2000), nullable=True),
        sa.Column("mode", sa.String(length=20), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("amount", sa.Integer(), nullable=True),
        sa.Column("currency", sa.String(length=3), nullable=True),
        sa.Column("payment_intent_id", sa.String(length=255), nullable=True),
        sa.Column("subscription_id", sa.String(length=255), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("session_expires_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["client_id"], ["clients.id"],
                                name=op.f("fk_payments_client_id_clients")),
        sa.ForeignKeyConstraint(["elicitation_id"], ["elicitations.id"],
                                name=op.f("fk_payments_elicitation_id_elicitations")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_payments")),
        sa.UniqueConstraint("checkout_session_id", name=op.f("uq_payments_checkout_session_id")),
        sa.UniqueConstraint("elicitation_id", "attempt", name=op.f("uq_payments_elicitation_id")),
    )
    op.create_index(op.f("ix_payments_client_id"), "payments", ["client_id"])
    op.create_index(op.f("ix_payments_elicitation_id"), "payments", ["elicitation_id"])
    op.create_index(op.f("ix_payments_status"), "payments", ["status"])
    op.create_table(
        "stripe_events",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("type", sa.String(length=100), nullable=False),
        sa.Column("checkout_session_id", sa.String(length=255), nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe_events")),
    )
    op.create_index(op.f("ix_stripe_events_checkout_session_id"), "stripe_events",
                    ["checkout_session_id"])
    op.create_index(op.f("ix_stripe_events_received_at"), "stripe_events", ["received_at"])


def downgrade() -> None:
    op.drop_table("stripe_events")
    op.drop_table("payments")
