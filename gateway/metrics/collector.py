"""What ``/metrics`` reports, computed from the database when Prometheus scrapes.

Counting from the database rather than in process memory gives every
instance and every gunicorn worker the same, complete answer, and survives
restarts: a completion recorded by one instance shows in the scrape of any.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine, case, func, select

from gateway.audit.models import AuditEvent
from gateway.clock import Clock
from gateway.db import for_reads
from gateway.elicitations.models import Elicitation
from gateway.webhooks.models import WebhookAttempt, WebhookEvent

LATENCY_BUCKETS_MS: Final = (25, 50, 100, 250, 500, 1000, 2500, 5000, 15000)
COMPLETION_BUCKETS_S: Final = (10, 30, 60, 120, 300, 600, 1800, 3600, 86400)
# From the change to the receiver: under a second when the first attempt
# lands, minutes to hours when the retry schedule had to step in.
DELIVERED_AFTER_BUCKETS_S: Final = (0.1, 0.5, 1, 5, 30, 300, 1800, 7200, 36000, 86400)
# Durations (to complete, to deliver) are taken over the recent past, not
# the whole history.
COMPLETION_WINDOW: Final = timedelta(days=1)


class DatabaseCollector(Collector):
    """A Prometheus collector whose every figure is one aggregate query."""

    def __init__(self, engine: Engine, clock: Clock) -> None:
        self._engine = engine
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily |
                                  HistogramMetricFamily]:
        with for_reads(self._engine).connect() as connection:
            now = self._clock.now()
            elicitations = GaugeMetricFamily(
                "gateway_elicitations", "Elicitations by kind and state",
                labels=["kind", "status"])
            for kind, status, count in connection.execute(
                    select(Elicitation.kind, Elicitation.status, func.count())
                    .group_by(Elicitation.kind, Elicitation.status)):
                elicitations.add_metric([kind, status], count)
            yield elicitations

            yield _duration_histogram(
                "gateway_elicitation_completion_seconds",
                "Time from creation to completion, over the last day", COMPLETION_BUCKETS_S,
                connection.execute(select(Elicitation.created_at, Elicitation.ended_at).where(
                    Elicitation.status == "completed",
                    Elicitation.ended_at >= now - COMPLETION_WINDOW)).all())

            attempts = CounterMetricFamily(
                "gateway_webhook_attempts", "Webhook delivery attempts by outcome",
                labels=["outcome"])
            for outcome, count in connection.execute(
                    select(WebhookAttempt.outcome, func.count())
                    .group_by(WebhookAttempt.outcome)):
                attempts.add_metric([outcome], count)
            yield attempts

            yield _latency_histogram(connection)
            yield _duration_histogram(
                "gateway_webhook_delivered_after_seconds",
                "Time from the change a webhook reports to its delivery, over the last day",
                DELIVERED_AFTER_BUCKETS_S,
                connection.execute(select(WebhookEvent.created_at, WebhookEvent.delivered_at)
                                   .where(WebhookEvent.status == "delivered",
                                          WebhookEvent.delivered_at >= now - COMPLETION_WINDOW))
                .all())

            backlog, oldest, dead = connection.execute(select(
                func.sum(case((WebhookEvent.status.in_(["pending", "delivering"]), 1),
                              else_=0)),
                func.min(case((WebhookEvent.status == "pending",
                               WebhookEvent.next_attempt_at), else_=None)),
                func.sum(case((WebhookEvent.status == "dead", 1), else_=0)),
            )).one()
            yield GaugeMetricFamily("gateway_outbox_backlog",
                                    "Webhook events waiting to be delivered", value=backlog or 0)
            yield GaugeMetricFamily(
                "gateway_outbox_oldest_due_seconds",
                "How long the oldest due webhook event has waited (0 when none)",
                value=max(0.0, (now - _aware(oldest, now)).total_seconds()) if oldest else 0.0)
            yield GaugeMetricFamily("gateway_webhooks_dead",
                                    "Webhook events whose every attempt failed", value=dead or 0)

            failures = connection.scalar(select(func.count()).where(
                AuditEvent.action == "login.failed")) or 0
            yield CounterMetricFamily("gateway_login_failures", "Failed logins",
                                      value=failures)


def _aware(moment: datetime | str, now: datetime) -> datetime:
    # Aggregates bypass the column type on some backends; SQLite hands back
    # a naive UTC value, or even its text form.
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return moment if moment.tzinfo else moment.replace(tzinfo=now.tzinfo)


def _duration_histogram(name: str, documentation: str, bounds: Sequence[float],
                        rows: Sequence[Any]) -> HistogramMetricFamily:
    """A histogram of the time between each row's two moments."""
    durations = [(ended - started).total_seconds() for started, ended in rows]
    buckets = [(str(bound), sum(1 for d in durations if d <= bound)) for bound in bounds]
    buckets.append(("+Inf", len(durations)))
    return HistogramMetricFamily(name, documentation, buckets=buckets,
                                 sum_value=sum(durations))


def _latency_histogram(connection: object) -> HistogramMetricFamily:
    columns = [func.sum(case((WebhookAttempt.latency_ms <= bound, 1), else_=0))
               for bound in LATENCY_BUCKETS_MS]
    row = connection.execute(  # type: ignore[attr-defined]
        select(*columns, func.count(), func.sum(WebhookAttempt.latency_ms))).one()
    counts = [int(value or 0) for value in row[:-2]]
    total, latency_sum = int(row[-2] or 0), int(row[-1] or 0)
    buckets = [(str(bound / 1000), count) for bound, count in zip(LATENCY_BUCKETS_MS, counts,
                                                                    strict=True)]
    buckets.append(("+Inf", total))
    return HistogramMetricFamily(
        "gateway_webhook_delivery_seconds", "Time each webhook delivery attempt took",
        buckets=buckets, sum_value=latency_sum / 1000)
