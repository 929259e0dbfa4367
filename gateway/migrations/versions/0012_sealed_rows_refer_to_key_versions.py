"""Every sealed row refers to its key version, so that a version in use cannot be retired.

``credentials.key_version`` and ``webhook_secrets.key_version`` become foreign
keys to ``key_versions`` that restrict deletion: a ``gateway keys retire`` and
the store of a secret sealed under the version it deletes cannot both commit,
whatever each process believed when it started.

A deployment that never rotated has no rows in ``key_versions`` yet: its
configured keyring's versions wrap data keys directly, and this migration
cannot carry them into the table (it has no key). So a version may now be
listed without its key (``root_version`` and ``wrapped_key`` NULL: the
configured keyring holds it), and every version a stored secret uses is
listed that way before the foreign keys are added.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from gateway.db import UTCDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

SEALED_TABLES = ("credentials", "webhook_secrets")
KEY_VERSIONS = sa.table("key_versions", sa.column("version", sa.Integer()),
                        sa.column("root_version", sa.Integer()),
                        sa.column("wrapped_key", sa.LargeBinary()),
                        sa.column("created_at", UTCDateTime()))


def upgrade() -> None:
    with op.batch_alter_table("key_versions") as table:
        table.alter_column("root_version", existing_type=sa.Integer(), nullable=True)
        table.alter_column("wrapped_key", existing_type=sa.LargeBinary(length=64),
                           nullable=True)
    connection = op.get_bind()
    listed = set(connection.execute(sa.select(KEY_VERSIONS.c.version)).scalars())
    used: set[int] = set()
    for name in SEALED_TABLES:
        sealed = sa.table(name, sa.column("key_version", sa.Integer()))
        used.update(connection.execute(
            sa.select(sealed.c.key_version).distinct()).scalars())
    now = datetime.now(UTC)
    op.bulk_insert(KEY_VERSIONS, [{"version": version, "root_version": None,
                                   "wrapped_key": None, "created_at": now}
                                  for version in sorted(used - listed)])
    for name in SEALED_TABLES:
        with op.batch_alter_table(name) as table:
            table.create_foreign_key(op.f(f"fk_{name}_key_version_key_versions"),
                                     "key_versions", ["key_version"], ["version"],
                                     ondelete="RESTRICT")


def downgrade() -> None:
    for name in SEALED_TABLES:
        with op.batch_alter_table(name) as table:
            table.drop_constraint(op.f(f"fk_{name}_key_version_key_versions"),
                                  type_="foreignkey")
    # Versions listed only for the foreign keys hold no key: the configured
    # keyring does, as before this revision.
    op.execute(sa.text("DELETE FROM key_versions WHERE wrapped_key IS NULL"))
    with op.batch_alter_table("key_versions") as table:
        table.alter_column("root_version", existing_type=sa.Integer(), nullable=False)
        table.alter_column("wrapped_key", existing_type=sa.LargeBinary(length=64),
                           nullable=False)
