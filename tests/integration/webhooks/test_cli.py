"""``gateway webhooks list|show|redeliver|test`` and ``gateway clients rotate-webhook-secret``."""

from __future__ import annotations

import getpass
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select
from standardwebhooks import Webhook

from gateway import db
from gateway.audit.models import AuditEvent
from gateway.client import verify_webhook
from gateway.clock import FixedClock
from gateway.webhooks.dispatcher import SCHEDULE, Dispatcher
from tests.conftest import Api, Registered
from tests.integration.conftest import Result
from tests.integration.webhooks.conftest import Fault, Receiver, end_one, events

pytestmark = pytest.mark.slow

TIMESTAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"


def ok(result: Result) -> str:
    assert result.code == 0, result.stderr
    return result.stdout


def audit_rows(app: Flask, action: str) -> list[AuditEvent]:
    with app.app_context():
        return list(db.session().scalars(select(AuditEvent).where(
            AuditEvent.action == action).order_by(AuditEvent.id)))


def table(output: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a CLI table, split on runs of two spaces or more."""
    header, *lines = output.strip().splitlines()
    return header.split(), [re.split(r"\s{2,}", line.strip()) for line in lines]


# --- list -------------------------------------------------------------------------------


def test_list_shows_events_newest_first_as_a_table_and_as_json(
    app: Flask, hooked: Registered, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher], invoke_gateway: Callable[..., Result],
) -> None:
    receiver.script = [500]
    end_one(hooked_api)
    make_dispatcher().run_once()
    clock.advance(seconds=1)
    end_one(hooked_api)
    make_dispatcher().run_once()
    failing, delivered = events(app)

    header, rows = table(ok(invoke_gateway("webhooks", "list")))
    assert header == ["ID", "CLIENT_ID", "TYPE", "STATUS", "ATTEMPTS", "CREATED_AT",
                      "LAST_ERROR"]
    assert [row[0] for row in rows] == [delivered.id, failing.id]
    assert rows[0][1:5] == [hooked.id, "elicitation.cancelled", "delivered", "1"]
    assert rows[0][6] == "-"
    assert rows[1][3:5] == ["pending", "1"]
    assert rows[1][6] == "answered 500"
    assert re.fullmatch(TIMESTAMP, rows[1][5])

    listed = json.loads(ok(invoke_gateway("webhooks", "list", "--json")))
    assert [item["id"] for item in listed] == [delivered.id, failing.id]
    assert set(listed[0]) == {"id", "client_id", "type", "elicitation_id", "status",
                              "attempts", "created_at", "next_attempt_at", "delivered_at",
                              "last_error"}
    assert listed[0]["delivered_at"] is not None
    assert listed[0]["next_attempt_at"] is None
    assert listed[1]["next_attempt_at"] is not None
    assert listed[1]["elicitation_id"] == failing.elicitation_id

    only = json.loads(ok(invoke_gateway("webhooks", "list", "--status", "pending", "--json")))
    assert [item["id"] for item in only] == [failing.id]
    assert json.loads(ok(invoke_gateway("webhooks", "list", "--client", "cl_nobody", "--json"))) \
        == []
    assert ok(invoke_gateway("webhooks", "list", "--status", "dead")).strip() == "(none)"


# --- show -------------------------------------------------------------------------------


def test_show_lists_every_attempt_with_time_status_latency_and_error(
    app: Flask, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher], invoke_gateway: Callable[..., Result],
) -> None:
    receiver.script = [503, Fault.HANG]
    end_one(hooked_api, metadata={"tool": "weather"})
    dispatcher = make_dispatcher(send_timeout=0.5)
    dispatcher.run_once()
    for attempt in (2, 3):
        clock.advance(seconds=SCHEDULE[attempt - 1].total_seconds() * 1.21)
        dispatcher.run_once()
    [event] = events(app)

    output = ok(invoke_gateway("webhooks", "show", event.id))
    summary, _, log = output.partition("attempts:\n")
    assert re.search(rf"^id:\s+{event.id}$", summary, re.MULTILINE)
    assert re.search(r"^status:\s+delivered$", summary, re.MULTILINE)
    assert re.search(r"^body:\s+\{.*\"tool\":\"weather\"", summary, re.MULTILINE)
    header, rows = table(log)
    assert header == ["ATTEMPT", "STARTED_AT", "STATUS_CODE", "LATENCY_MS", "OUTCOME", "ERROR"]
    assert [(row[0], row[2], row[4], row[5]) for row in rows] == [
        ("1", "503", "failed", "answered 503"),
        ("2", "-", "failed", "timed out"),
        ("3", "204", "delivered", "-")]
    for row in rows:
        assert re.fullmatch(TIMESTAMP, row[1])
        assert row[3].isdigit()
    assert int(rows[1][3]) >= 450  # the half-second timeout

    shown = json.loads(ok(invoke_gateway("webhooks", "show", event.id, "--json")))
    assert shown["id"] == event.id
    assert json.loads(shown["body"])["data"]["metadata"] == {"tool": "weather"}
    log_json = shown["attempt_log"]
    assert [set(a) for a in log_json] == [
        {"attempt", "started_at", "status_code", "latency_ms", "outcome", "error"}] * 3
    assert [(a["attempt"], a["status_code"], a["error"]) for a in log_json] == [
        (1, 503, "answered 503"), (2, None, "timed out"), (3, 204, None)]
    assert [a["started_at"] for a in log_json] == sorted(a["started_at"] for a in log_json)

    missing = invoke_gateway("webhooks", "show", "msg_nope")
    assert missing.code == 1
    assert "no webhook event 'msg_nope'" in missing.stderr


# --- redeliver --------------------------------------------------------------------------


def test_redeliver_sends_again_with_the_same_id_and_is_audited(
    app: Flask, hooked: Registered, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher], invoke_gateway: Callable[..., Result],
) -> None:
    receiver.script = [500]
    end_one(hooked_api)
    dispatcher = make_dispatcher()
    dispatcher.run_once()
    clock.advance(seconds=SCHEDULE[1].total_seconds() * 1.21)
    dispatcher.run_once()
    [event] = events(app)
    assert event.status == "delivered"
    clock.advance(seconds=60)

    assert ok(invoke_gateway("webhooks", "redeliver", event.id)).strip() == \
        f"event {event.id} queued for delivery"
    [queued] = events(app)
    assert (queued.status, queued.attempts) == ("pending", 0)
    assert dispatcher.run_once() == 1
    assert receiver.ids() == [event.id] * 3
    assert receiver.deliveries[2].body == receiver.deliveries[0].body
    Webhook(hooked.webhook_secret).verify(receiver.deliveries[2].body,
                                          receiver.deliveries[2].headers)
    assert events(app)[0].status == "delivered"

    [audited] = audit_rows(app, "webhook.redelivered")
    assert audited.target == event.id
    assert audited.actor == f"operator:{getpass.getuser()}"
    assert audited.details == {"client_id": hooked.id, "previous_status": "delivered"}

    # The log keeps every attempt, before and after the redelivery, in the order they ran.
    shown = json.loads(ok(invoke_gateway("webhooks", "show", event.id, "--json")))
    assert [(a["attempt"], a["status_code"]) for a in shown["attempt_log"]] == [
        (1, 500), (2, 204), (1, 204)]

    missing = invoke_gateway("webhooks", "redeliver", "msg_nope")
    assert missing.code == 1
    assert "no webhook event" in missing.stderr


def test_an_event_being_delivered_is_not_redelivered(
    app: Flask, hooked_api: Api, make_dispatcher: Callable[..., Dispatcher],
    invoke_gateway: Callable[..., Result],
) -> None:
    end_one(hooked_api)
    [claim] = make_dispatcher().claim(1)
    refused = invoke_gateway("webhooks", "redeliver", claim.event_id)
    assert refused.code == 1
    assert "being delivered right now" in refused.stderr
    assert audit_rows(app, "webhook.redelivered") == []


# --- test -------------------------------------------------------------------------------


def test_test_sends_a_signed_ping_and_prints_the_outcome(
    app: Flask, hooked: Registered, receiver: Receiver, invoke_gateway: Callable[..., Result],
) -> None:
    output = ok(invoke_gateway("webhooks", "test", hooked.name))
    lines = dict(re.split(r":\s+", line, maxsplit=1) for line in output.strip().splitlines())
    assert lines["delivered"] == "True"
    assert lines["status_code"] == "204"
    assert lines["url"] == receiver.url
    assert lines["latency_ms"].isdigit()
    [ping] = receiver.deliveries
    assert lines["webhook_id"] == ping.headers["webhook-id"]
    payload = verify_webhook(hooked.webhook_secret, ping.headers, ping.body)
    assert payload["type"] == "ping"
    assert payload["data"] == {"client_id": hooked.id}
    assert events(app) == []  # a ping is not an event of the outbox

    as_json: dict[str, Any] = json.loads(ok(invoke_gateway("webhooks", "test", hooked.id,
                                                           "--json")))
    assert as_json["delivered"] is True
    assert as_json["webhook_id"] != ping.headers["webhook-id"]
    assert [row.outcome for row in audit_rows(app, "webhook.tested")] == ["success", "success"]


def test_test_exits_1_when_the_ping_is_not_delivered(
    app: Flask, hooked: Registered, receiver: Receiver, invoke_gateway: Callable[..., Result],
) -> None:
    receiver.script = [500]
    refused = invoke_gateway("webhooks", "test", hooked.id, "--json")
    assert refused.code == 1
    outcome = json.loads(refused.stdout)
    assert (outcome["delivered"], outcome["status_code"]) == (False, 500)

    receiver.script = [Fault.RESET]
    broken = invoke_gateway("webhooks", "test", hooked.id)
    assert broken.code == 1
    assert re.search(r"^delivered:\s+False$", broken.stdout, re.MULTILINE)
    assert re.search(r"^error:\s+ConnectionError$", broken.stdout, re.MULTILINE)
    assert [row.outcome for row in audit_rows(app, "webhook.tested")] == ["failure", "failure"]


def test_test_refuses_a_client_without_a_webhook_url(
    register: Callable[..., Registered], invoke_gateway: Callable[..., Result],
) -> None:
    plain = register()
    refused = invoke_gateway("webhooks", "test", plain.id)
    assert refused.code == 1
    assert "has no webhook URL" in refused.stderr


# --- rotating the secret --------------------------------------------------------------------


def test_rotate_webhook_secret_prints_the_new_secret_once(
    app: Flask, hooked: Registered, hooked_api: Api, receiver: Receiver,
    make_dispatcher: Callable[..., Dispatcher], invoke_gateway: Callable[..., Result],
) -> None:
    result = invoke_gateway("clients", "rotate-webhook-secret", hooked.name)
    output = ok(result)
    secrets = re.findall(r"whsec_[A-Za-z0-9+/=]+", output + result.stderr)
    assert len(secrets) == 1
    [new_secret] = secrets
    assert new_secret != hooked.webhook_secret
    assert output.startswith(f"new webhook secret: {new_secret}\n")
    assert "Shown this once" in output

    for shown in (ok(invoke_gateway("clients", "show", hooked.id, "--json")),
                  ok(invoke_gateway("clients", "list"))):
        assert new_secret not in shown
        assert new_secret[6:20] not in shown
    [audited] = audit_rows(app, "client.webhook_secret_rotated")
    assert new_secret[6:20] not in json.dumps(audited.details)

    # Deliveries are signed with both while the grace runs.
    end_one(hooked_api)
    make_dispatcher().run_once()
    [delivery] = receiver.deliveries
    for secret in (hooked.webhook_secret, new_secret):
        Webhook(secret).verify(delivery.body, delivery.headers)

    rotated = json.loads(ok(invoke_gateway("clients", "rotate-webhook-secret", hooked.id,
                                           "--json")))
    assert set(rotated) == {"client", "webhook_secret", "grace_hours"}
    assert rotated["webhook_secret"].startswith("whsec_")
    assert rotated["webhook_secret"] not in (new_secret, hooked.webhook_secret)
    assert rotated["grace_hours"] == 24
