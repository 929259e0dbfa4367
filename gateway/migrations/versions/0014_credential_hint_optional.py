"""A credential's hint may be absent: a type with ``hint = false`` keeps none.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("credentials") as table:
        table.alter_column("hint", existing_type=sa.String(length=20), nullable=True)


def downgrade() -> None:
    # The older schema wants a hint on every row: the placeholder a short key gets.
    op.execute(sa.text("UPDATE credentials SET hint = '…' WHERE hint IS NULL"))
    with op.batch_alter_table("credentials") as table:
        table.alter_column("hint", existing_type=sa.String(length=20), nullable=False)
