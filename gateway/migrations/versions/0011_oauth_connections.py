"""OAuth connections: what a connection holds beside its sealed token set, and login states.

Credentials gain their kind (``api_key`` or ``oauth``), the reason a
credential was revoked, and for OAuth connections the account, the granted
scopes, the access token's expiry and the refresh lease that lets one
process at a time refresh a connection. Elicitations gain the scopes they
ask for. ``oauth_states`` holds the pending authorization requests, each
under the keyed digest of its ``state``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gateway.db import UTCDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("credentials") as table:
        table.add_column(sa.Column("kind", sa.String(length=20), nullable=False,
                                   server_default="api_key"))
        table.add_column(sa.Column("revoked_reason", sa.String(length=40), nullable=True))
        table.add_column(sa.Column("account", sa.String(length=255), nullable=True))
        table.add_column(sa.Column("scopes", sa.JSON(), nullable=True))
        table.add_column(sa.Column("token_expires_at", UTCDateTime(), nullable=True))
        table.add_column(sa.Column("refreshed_at", UTCDateTime(), nullable=True))
        table.add_column(sa.Column("refresh_lease_until", UTCDateTime(), nullable=True))
        table.add_column(sa.Column("refresh_lease_holder", sa.String(length=40), nullable=True))
    with op.batch_alter_table("elicitations") as table:
        table.add_column(sa.Column("scopes", sa.JSON(), nullable=True))
    op.create_table(
        "oauth_states",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("elicitation_id", sa.String(length=40), nullable=False),
        sa.Column("session_digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("used_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["elicitation_id"], ["elicitations.id"],
                                name=op.f("fk_oauth_states_elicitation_id_elicitations")),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_oauth_states")),
    )
    op.create_index(op.f("ix_oauth_states_expires_at"), "oauth_states", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_oauth_states_expires_at"), table_name="oauth_states")
    op.drop_table("oauth_states")
    with op.batch_alter_table("elicitations") as table:
        table.drop_column("scopes")
    with op.batch_alter_table("credentials") as table:
        for column in ("refresh_lease_holder", "refresh_lease_until", "refreshed_at",
                       "token_expires_at", "scopes", "account", "revoked_reason", "kind"):
            table.drop_column(column)
