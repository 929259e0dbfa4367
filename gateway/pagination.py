"""Cursor pagination and timestamps, shared by every listing of the API.

A cursor names the last row of a page by (created_at, id): stable while rows
are added, and opaque to callers, who only hand it back.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from gateway.errors import InvalidInput


def encode_cursor(created_at: datetime, row_id: str) -> str:
    """The cursor that continues after this row."""
    raw = f"{created_at.isoformat()}|{row_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The position a cursor points after; a cursor we did not make is refused."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, last_id = raw.split("|", 1)
        moment = datetime.fromisoformat(created_at)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidInput("cursor is not one this API returned", field="cursor") from None
    if moment.tzinfo is None:
        raise InvalidInput("cursor is not one this API returned", field="cursor")
    return moment, last_id


def timestamp(moment: datetime | None) -> str | None:
    """RFC 3339 in UTC with a Z, to the millisecond."""
    if moment is None:
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
