"""``GET /metrics``: Prometheus text, only for configured networks or a bearer token."""

from __future__ import annotations

import hmac
import ipaddress
from typing import Final

from flask import Blueprint, Response, current_app, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import CollectorRegistry

from gateway import db
from gateway.errors import NotFound
from gateway.metrics import counters
from gateway.metrics.collector import DatabaseCollector
from gateway.settings import Settings
from gateway.web.ratelimit import bearer_token

blueprint = Blueprint("metrics", __name__)
EXTENSION: Final = "gateway.metrics"


def _registry() -> CollectorRegistry:
    registry: CollectorRegistry | None = current_app.extensions.get(EXTENSION)
    if registry is None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(DatabaseCollector(db.engine(), current_app.extensions["gateway.clock"]))
        folder = counters.multiprocess_folder()
        if folder is not None:
            # Every worker process's counters, this one's included.
            MultiProcessCollector(registry, path=str(folder))  # type: ignore[no-untyped-call]
        else:
            for counter in counters.of(current_app).all():
                registry.register(counter)
        current_app.extensions[EXTENSION] = registry
    return registry


def allowed(settings: Settings) -> bool:
    """From a listed network, or with the metrics token; nobody else."""
    token = bearer_token()
    if token and settings.metrics_token is not None and hmac.compare_digest(
            token.encode(), settings.metrics_token.reveal().encode()):
        return True
    try:
        address = ipaddress.ip_address(request.remote_addr or "")
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(network) for network in settings.metrics_networks)


@blueprint.get("/metrics")
def metrics() -> Response:
    """Counts of elicitations, webhook deliveries, backlog, failed logins, rate-limit hits."""
    if not allowed(current_app.extensions["gateway.settings"]):
        # Answered like a page that does not exist: no hint that it is here.
        raise NotFound("Not found")
    return Response(generate_latest(_registry()), mimetype=CONTENT_TYPE_LATEST)
