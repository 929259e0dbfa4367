"""URL converters: path parameters that can only be what the gateway mints.

An id in a path is URL-safe base64 after a short prefix. Anything else
(a NUL byte, which PostgreSQL refuses with an error, a slash, a space) is
answered 404 by routing itself, before any code or query sees it.
"""

from __future__ import annotations

from werkzeug.routing import BaseConverter

from gateway.tokens import ID_PATTERN


class IdConverter(BaseConverter):
    """``<id:name>``: a gateway id such as ``el_…`` or ``cr_…``."""

    regex = ID_PATTERN
