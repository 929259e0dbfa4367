"""gunicorn's logger, writing through the gateway's log handler (:mod:`gateway.logs`).

gunicorn's own error and access lines then come out in the configured format
beside the app's, and an access line carries structured fields and the
request id its response was given.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from gunicorn import glogging

REQUEST_ID_HEADER: Final = "x-request-id"


class GatewayLogger(glogging.Logger):  # type: ignore[misc]
    """gunicorn's logger without handlers of its own: records go to the root handler."""

    def setup(self, cfg: Any) -> None:
        logs = (self.error_log, self.access_log)
        before = [list(log.handlers) for log in logs]
        super().setup(cfg)
        # Whatever gunicorn's setup added is gunicorn's own; handlers set by
        # anyone else stay.
        for log, kept in zip(logs, before, strict=True):
            for handler in [h for h in log.handlers if h not in kept]:
                log.removeHandler(handler)
            log.propagate = True

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        # Each worker listens on a socket of its own (reuse_port), so the
        # master has none, and gunicorn would announce "Listening at:  (pid)"
        # with an empty address. The gateway logs where it serves itself.
        if msg.startswith("Listening at:") and args and not args[0]:
            return
        super().info(msg, *args, **kwargs)

    def access(self, resp: Any, req: Any, environ: dict[str, Any],
               request_time: timedelta) -> None:
        """One line per request: no query string (tokens hide there), no header, no body."""
        fields = access_fields(resp.status_code, resp.headers, getattr(resp, "sent", None),
                               environ, request_time)
        self.access_log.info(
            '%s "%s %s %s" %s %s %sms', fields["remote_addr"], fields["method"], fields["path"],
            environ.get("SERVER_PROTOCOL", "-"), fields["status"], fields["bytes"],
            fields["duration_ms"], extra=fields)


def access_fields(status: int | None, headers: list[tuple[str, str]], sent: int | None,
                  environ: dict[str, Any], request_time: timedelta) -> dict[str, Any]:
    """The structured fields of an access line.

    The remote address is the one the app settled on: with GATEWAY_PROXY_HOPS
    set, the app's proxy handling rewrote it in this same environ.
    """
    request_id = next((value for name, value in headers
                       if name.lower() == REQUEST_ID_HEADER), None)
    return {
        "method": environ.get("REQUEST_METHOD", "-"),
        "path": environ.get("PATH_INFO", ""),
        "status": status,
        "duration_ms": round(request_time.total_seconds() * 1000),
        "bytes": sent or 0,
        "remote_addr": environ.get("REMOTE_ADDR", "-"),
        "request_id": request_id,
    }

