"""Benchmark webhook delivery: commit→receipt latency at a steady rate, then throughput.

    .venv/bin/python bench/webhooks.py [--database sqlite|postgres] [--seconds N]
                                       [--rate N] [--events N] [--concurrency N]

Everything runs on loopback in a scratch instance (and, for PostgreSQL, a
scratch database), undone afterwards:

- a receiver in this process: plain http on 127.0.0.1, allowed for exactly its
  host and port through GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS, keep-alive,
  checking every signature as an MCP server would, noting when each arrives;
- one real ``gateway worker`` process doing the dispatching;
- latency: a producer here cancels pending elicitations at a steady rate
  (default 100/s) through the gateway's service layer, one transaction each,
  the same code path as the API's cancel, and notes when each commit returned;
  latency is receipt minus commit, per elicitation;
- throughput: with the worker stopped, N events (default 5,000) go into the
  outbox; the worker starts and the receiver times first to last arrival.

Targets: p50 ≤ 50 ms and p99 ≤ 250 ms at 100 completions/s, and at least
500 deliveries/s. Like bench/run.py it is a benchmark, not a test: it prints
the figures and exits 0 whatever they are (2 when it cannot set up).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import servers
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.client import WebhookVerificationError, verify_webhook
from gateway.clients.models import Client
from gateway.clock import SystemClock
from gateway.db import make_engine
from gateway.elicitations import service
from gateway.elicitations.models import Elicitation
from gateway.settings import load_settings
from gateway.tokens import new_id
from gateway.webhooks import outbox
from gateway.webhooks.models import WebhookEvent

TARGET_P50_MS = 50.0
TARGET_P99_MS = 250.0
TARGET_RATE = 500.0
WORKER_START_TIMEOUT_S = 30.0
# Unmeasured completions first, at the same rate: connections and caches warm.
WARMUP_S = 1.0


# --- the receiver ---------------------------------------------------------------


@dataclass
class Receiver:
    """What arrived: when, which event, how often each webhook-id came."""

    secret: str = ""
    arrivals: dict[str, float] = field(default_factory=dict)  # elicitation id → monotonic
    times: list[float] = field(default_factory=list)
    ids: Counter[str] = field(default_factory=Counter)
    bad_signatures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.arrivals.clear()
            self.times.clear()
            self.ids.clear()
            self.bad_signatures = 0

    def record(self, headers: dict[str, str], body: bytes) -> None:
        arrived = time.monotonic()
        try:
            event = verify_webhook(self.secret, headers, body)
        except WebhookVerificationError:
            with self.lock:
                self.bad_signatures += 1
            return
        with self.lock:
            self.times.append(arrived)
            self.ids[headers.get("webhook-id", "")] += 1
            elicitation_id = event["data"].get("elicitation_id")
            if elicitation_id:
                self.arrivals.setdefault(elicitation_id, arrived)

    def count(self) -> int:
        with self.lock:
            return len(self.times)


@contextmanager
def serve_receiver(receiver: Receiver) -> Iterator[str]:
    """The receiver on a free loopback port; yields its ``host:port``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real endpoint would

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            receiver.record(dict(self.headers), body)
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((servers.HOST, 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="receiver", daemon=True)
    thread.start()
    try:
        yield f"{servers.HOST}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# --- the gateway: instance, client, worker ------------------------------------------------


@dataclass
class Instance:
    environ: dict[str, str]
    folder: Path
    sessions: sessionmaker[Session]
    client_id: str


def create_client(environ: dict[str, str], folder: Path, url: str) -> dict[str, Any]:
    result = subprocess.run([*servers.GATEWAY_COMMAND, "clients", "create", "bench-webhooks",
                             "--webhook-url", url, "--json"], env=environ, cwd=folder,
                            capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise servers.BenchSetupError(f"`gateway clients create` exited {result.returncode}",
                                      result.stderr)
    minted: dict[str, Any] = json.loads(result.stdout)
    return minted


@contextmanager
def worker(environ: dict[str, str], folder: Path,
           name: str) -> Iterator[subprocess.Popen[bytes]]:
    """A ``gateway worker`` process, started and listening; stopped with SIGTERM after.

    ``environ`` must set GATEWAY_LOG_LEVEL=info: the worker's "worker started"
    line is how its start is seen.
    """
    log = folder / f"{name}.log"
    with log.open("wb") as output:
        process = subprocess.Popen([*servers.GATEWAY_COMMAND, "worker"], env=environ,
                                   cwd=folder, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while "worker started" not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise servers.BenchSetupError("the worker did not start",
                                              log.read_text(errors="replace")[-2000:])
            time.sleep(0.05)
        time.sleep(0.3)  # from the log line to the dispatcher's loop
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=servers.STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def pending_elicitations(instance: Instance, count: int) -> list[str]:
    """``count`` open elicitations of the bench client, inserted in one transaction."""
    now = datetime.now(UTC)
    ids = [new_id("el_", 18) for _ in range(count)]
    with instance.sessions.begin() as session:
        session.add_all(Elicitation(
            id=elicitation_id, client_id=instance.client_id,
            subject_iss="https://auth.example.com", subject_sub=f"user-{n}", kind="api_key",
            credential_type="generic", message="Connect your weather API key",
            metadata_={"n": n}, status="pending", created_at=now,
            expires_at=now + timedelta(hours=1)) for n, elicitation_id in enumerate(ids))
    return ids


# --- phase 1: latency at a steady rate --------------------------------------------------


def percentile(values: list[float], share: float) -> float:
    """The value ``share`` of the way up the sorted ``values`` (nearest rank); NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


@dataclass
class Latency:
    rate: float
    seconds: float
    sent: int
    received: int
    duplicates: int
    achieved_rate: float
    latencies_ms: list[float]

    def percentile(self, share: float) -> float:
        return percentile(self.latencies_ms, share)


def cancel_at_rate(instance: Instance, ids: list[str], rate: float) -> dict[str, float]:
    """Cancel each elicitation on a fixed schedule; when each commit returned."""
    committed: dict[str, float] = {}
    clock = SystemClock()
    start = time.monotonic()
    for n, elicitation_id in enumerate(ids):
        delay = start + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        with instance.sessions.begin() as session:
            elicitation = session.get(Elicitation, elicitation_id)
            assert elicitation is not None
            service.cancel(session, clock, elicitation, actor="bench:webhooks")
        committed[elicitation_id] = time.monotonic()
    return committed


def measure_latency(instance: Instance, receiver: Receiver, rate: float,
                    seconds: float) -> Latency:
    warmup = pending_elicitations(instance, round(rate * WARMUP_S))
    measured = pending_elicitations(instance, round(rate * seconds))
    with worker(instance.environ, instance.folder, "worker-latency"):
        cancel_at_rate(instance, warmup, rate)
        began = time.monotonic()
        committed = cancel_at_rate(instance, measured, rate)
        achieved = len(measured) / (time.monotonic() - began)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with receiver.lock:
                if all(e in receiver.arrivals for e in measured):
                    break
            time.sleep(0.05)
    with receiver.lock:
        latencies = [(receiver.arrivals[e] - committed[e]) * 1000
                     for e in measured if e in receiver.arrivals]
        duplicates = sum(n - 1 for n in receiver.ids.values())
    return Latency(rate, seconds, len(measured), len(latencies), duplicates, achieved,
                   latencies)


# --- phase 2: throughput over a backlog -----------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of a process so far (Linux); None where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Throughput:
    events: int
    received: int
    duplicates: int
    delivered_in_db: int
    first_to_last_s: float
    start_to_last_s: float
    worker_cpu_s: float | None

    @property
    def rate(self) -> float:
        if self.received < 2 or self.first_to_last_s <= 0:
            return 0.0
        return (self.received - 1) / self.first_to_last_s


def enqueue_backlog(instance: Instance, count: int) -> None:
    """``count`` events in the outbox, as cancellations would write them."""
    clock = SystemClock()
    with instance.sessions.begin() as session:
        client = session.get(Client, instance.client_id)
        assert client is not None
        for n in range(count):
            outbox.enqueue(session, clock, client.id, client.webhook_url, "elicitation.cancelled", {
                "elicitation_id": new_id("el_", 18), "status": "cancelled",
                "kind": "api_key", "subject": {"iss": "https://auth.example.com",
                                               "sub": f"user-{n}"}, "metadata": {"n": n}})


def measure_throughput(instance: Instance, receiver: Receiver, events: int) -> Throughput:
    receiver.reset()
    enqueue_backlog(instance, events)
    started = time.monotonic()
    with worker(instance.environ, instance.folder, "worker-throughput") as process:
        cpu_before = cpu_seconds(process.pid)
        deadline = time.monotonic() + max(60.0, events / 50)
        while receiver.count() < events and time.monotonic() < deadline:
            time.sleep(0.05)
        with receiver.lock:
            times = sorted(receiver.times)
            duplicates = sum(n - 1 for n in receiver.ids.values())
        # The last outcomes are written just after their answers.
        time.sleep(0.5)
        cpu_after = cpu_seconds(process.pid)
    with instance.sessions() as session:
        delivered = session.scalar(select(func.count()).select_from(WebhookEvent).where(
            WebhookEvent.status == "delivered", WebhookEvent.type == "elicitation.cancelled",
            WebhookEvent.elicitation_id.is_(None))) or 0
    first_to_last = times[-1] - times[0] if len(times) > 1 else 0.0
    start_to_last = times[-1] - started if times else 0.0
    worker_cpu = (cpu_after - cpu_before
                  if cpu_before is not None and cpu_after is not None else None)
    return Throughput(events, len(times), duplicates, delivered, first_to_last, start_to_last,
                      worker_cpu)


# --- output -----------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "ok" if ok else "SHORT"


def print_report(args: argparse.Namespace, database: str, receiver_host: str,
                 concurrency: int, latency: Latency, throughput: Throughput) -> None:
    p50, p99 = latency.percentile(0.50), latency.percentile(0.99)
    print(f"webhooks benchmark: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{platform.machine()}, {os.cpu_count()} cores, load "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"database: {database}; one `gateway worker`, webhook concurrency {concurrency}")
    print(f"receiver: plain http on {receiver_host} (loopback, allowed by "
          "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS), keep-alive, signatures verified")
    print()
    rows = [
        ("phase", "measure", "result", "target", ""),
        (f"latency, {latency.rate:.0f}/s for {latency.seconds:.0f} s",
         "commit→receipt p50", f"{p50:.1f} ms", f"≤ {TARGET_P50_MS:.0f} ms",
         verdict(p50 <= TARGET_P50_MS)),
        ("", "commit→receipt p99", f"{p99:.1f} ms", f"≤ {TARGET_P99_MS:.0f} ms",
         verdict(p99 <= TARGET_P99_MS)),
        ("", "max", f"{max(latency.latencies_ms, default=float('nan')):.1f} ms", "", ""),
        ("", "completions/s achieved", f"{latency.achieved_rate:.1f}", "", ""),
        ("", "received / committed", f"{latency.received} / {latency.sent}", "",
         verdict(latency.received == latency.sent)),
        (f"throughput, {throughput.events} queued", "deliveries/s (first→last)",
         f"{throughput.rate:.0f}", f"≥ {TARGET_RATE:.0f}", verdict(throughput.rate >= TARGET_RATE)),
        ("", "worker CPU per delivery", "-" if throughput.worker_cpu_s is None else
         f"{throughput.worker_cpu_s / max(1, throughput.received) * 1000:.2f} ms", "", ""),
        ("", "all sent, from worker start", f"{throughput.start_to_last_s:.2f} s", "", ""),
        ("", "received / delivered in db", f"{throughput.received} / "
         f"{throughput.delivered_in_db}", "",
         verdict(throughput.received == throughput.delivered_in_db == throughput.events)),
        ("both", "duplicate deliveries", str(latency.duplicates + throughput.duplicates), "0",
         verdict(latency.duplicates + throughput.duplicates == 0)),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip())
        if n == 0:
            print("  ".join("-" * width for width in widths))


# --- main -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Benchmark webhook delivery on loopback.")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite",
                        help="postgres: a scratch database on TEST_DATABASE_URL "
                             f"(default {servers.DEFAULT_POSTGRES_URL})")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="length of the latency phase (default 10)")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="completions per second in the latency phase (default 100)")
    parser.add_argument("--events", type=int, default=5000,
                        help="events queued for the throughput phase (default 5000)")
    parser.add_argument("--concurrency", type=int,
                        help="the worker's GATEWAY_WEBHOOK_CONCURRENCY (default: the "
                             "gateway's own default)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    receiver = Receiver()
    try:
        with tempfile.TemporaryDirectory(prefix="gateway-bench-webhooks-") as scratch, \
                servers.scratch_database(args.database) as database_url, \
                serve_receiver(receiver) as receiver_host:
            folder = Path(scratch)
            environ = servers.scratch_environ(folder / "instance", servers.free_port(),
                                              database_url)
            environ["GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS"] = receiver_host
            environ["GATEWAY_LOG_LEVEL"] = "info"  # the worker says "worker started"
            if args.concurrency:
                environ["GATEWAY_WEBHOOK_CONCURRENCY"] = str(args.concurrency)
            servers.init_instance(environ, folder)
            minted = create_client(environ, folder, f"http://{receiver_host}/hooks")
            receiver.secret = minted["webhook_secret"]
            settings = load_settings(environ)
            engine = make_engine(settings.database_url)
            try:
                instance = Instance(environ, folder, sessionmaker(engine, expire_on_commit=False),
                                    minted["client_id"])
                latency = measure_latency(instance, receiver, args.rate, args.seconds)
                throughput = measure_throughput(instance, receiver, args.events)
            finally:
                engine.dispose()
            print_report(args, servers.describe_database(database_url), receiver_host,
                         settings.webhook_concurrency, latency, throughput)
    except servers.BenchSetupError as error:
        print(f"bench: {error}", file=sys.stderr)
        if error.detail:
            print(error.detail, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        with suppress(Exception):
            print("bench: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
