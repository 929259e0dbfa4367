"""Cursor pagination and timestamps, shared by every listing of the API.

A cursor names the last row of a page by (created_at, id): stable while rows
are added, and opaque to callers, who only hand it back.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime
from typing import overload

from gateway.errors import InvalidInput
from gateway.tokens import ID_PATTERN

_ROW_ID = re.compile(ID_PATTERN)


def encode_cursor(created_at: datetime, row_id: str) -> str:
    """The cursor that continues after this row."""
    raw = f"{created_at.isoformat()}|{row_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The position a cursor points after; a cursor we did not make is refused.

    Whatever is refused here would otherwise reach the query: a moment that
    leaves datetime's range once moved to UTC (``0001-01-01T00:00:00+14:00``)
    or an id with a NUL, which PostgreSQL refuses, would answer 500.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, last_id = raw.split("|", 1)
        moment = datetime.fromisoformat(created_at)
        if moment.tzinfo is None or not _ROW_ID.fullmatch(last_id):
            raise ValueError
        return moment.astimezone(UTC), last_id
    except (binascii.Error, UnicodeDecodeError, ValueError, OverflowError):
        raise InvalidInput("cursor is not one this API returned", field="cursor") from None


@overload
def timestamp(moment: datetime) -> str: ...


@overload
def timestamp(moment: datetime | None) -> str | None: ...


def timestamp(moment: datetime | None) -> str | None:
    """RFC 3339 in UTC with a Z, to the millisecond."""
    if moment is None:
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
