"""One live credential per owner (client, subject and type), enforced by the database.

The index of live credentials becomes unique. A capture revokes the owner's
live key and stores the new one in one statement; two captures for one owner
at once used to take turns on a lock so that the second saw the first's key.
Now the database refuses the second's key while the first's is live, and the
capture runs again, revoking it (see ``gateway.credentials.service.capture``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_LIVE = sa.text("revoked_at IS NULL")
_OWNER = ["client_id", "subject_iss", "subject_sub", "type"]
_INDEX = "ix_credentials_live_owner"
_OWNERS_WITH_TWO_LIVE_KEYS = sa.text(
    "SELECT client_id, subject_iss, subject_sub, type FROM credentials "
    "WHERE revoked_at IS NULL GROUP BY client_id, subject_iss, subject_sub, type "
    "HAVING count(*) > 1")


def upgrade() -> None:
    doubled = op.get_bind().execute(_OWNERS_WITH_TWO_LIVE_KEYS).first()
    if doubled is not None:
        raise RuntimeError(
            f"client {doubled.client_id} holds more than one live {doubled.type} key of "
            f"{doubled.subject_iss} {doubled.subject_sub}; revoke all but the newest "
            "(`gateway credentials list`, `gateway credentials revoke ID`) and upgrade again")
    op.drop_index(_INDEX, table_name="credentials")
    op.create_index(_INDEX, "credentials", _OWNER, unique=True,
                    sqlite_where=_LIVE, postgresql_where=_LIVE)


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="credentials")
    op.create_index(_INDEX, "credentials", _OWNER, sqlite_where=_LIVE, postgresql_where=_LIVE)
