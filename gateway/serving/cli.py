"""``gateway serve``: gunicorn with gevent workers, terminating TLS itself."""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket
from pathlib import Path

import click
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from gateway import cli, migrations, preflight
from gateway.db import POSTGRES_CONNECTIONS_PER_PROCESS, make_engine
from gateway.files import FileError
from gateway.outbound import OutboundPolicy
from gateway.serving import server, tls
from gateway.settings import Settings, SettingsError
from gateway.vault.keyring import KeyringError, load_keyring
from gateway.web import ratelimit

log = logging.getLogger(__name__)
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
MAX_WORKERS = 64
DEFAULT_WAITS = 10_000
MAX_WAITS = 1_000_000
# Open files a worker needs beside its connections: database connections,
# log files, the listening socket, the libraries' own.
FILES_BESIDE_CONNECTIONS = 200
# What an unlimited open-file limit counts as.
MAX_FILES = 2 * MAX_WAITS


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8443, show_default=True, type=click.IntRange(1, 65535))
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS),
              help="Worker processes.  [default: one per CPU this process may run on]")
@click.option("--waits", type=click.IntRange(1, MAX_WAITS),
              help="Long-polls (?wait=N) each worker holds at once; past that a wait "
                   f"answers at once with the current state.  [default: {DEFAULT_WAITS:,}, "
                   "fewer where the open-file limit is lower]")
@click.option("--certfile", type=click.Path(path_type=Path), help="TLS certificate (PEM).")
@click.option("--keyfile", type=click.Path(path_type=Path), help="TLS private key (PEM, 0600).")
@click.option("--no-tls", is_flag=True,
              help="Serve plain HTTP to a TLS-terminating proxy; needs GATEWAY_PROXY_HOPS >= 1.")
@click.option("--no-worker", is_flag=True,
              help="Do not run `gateway worker` beside the server (run workers apart).")
@click.option("--pin-workers", is_flag=True,
              help="With at least one worker per CPU, keep each worker process on a "
                   "CPU of its own; otherwise the kernel places them.")
def serve(host: str, port: int, workers: int | None, waits: int | None,
          certfile: Path | None, keyfile: Path | None, no_tls: bool, no_worker: bool,
          pin_workers: bool) -> None:
    """Serve the gateway over HTTPS (and, unless --no-worker, send its webhooks)."""
    settings = cli.settings()
    workers = workers or default_workers()
    policy = _check_secrets_and_destinations(settings)
    tls_files = None if no_tls else _tls_files(settings, certfile, keyfile)
    if no_tls and settings.proxy_hops < 1:
        cli.fail("--no-tls serves plain HTTP and is only for a TLS-terminating proxy in "
                 "front; set GATEWAY_PROXY_HOPS to the number of proxies")
    _check_database(settings, workers)
    _check_what_may_fail_later(settings, policy)
    _check_port_free(host, port)
    _say_how_api_limits_count(settings, workers)
    waits = _waits_that_fit(waits)
    server.become_server(settings, server.Options(host=host, port=port, workers=workers,
                                        waits=waits, tls_files=tls_files,
                                        with_worker=not no_worker, pin_workers=pin_workers),
                         in_child=click.get_current_context().meta.get(server.IN_CHILD, False))


def default_workers() -> int:
    """One worker process per CPU this process may run on (its affinity, where the OS has one).

    A container or a ``taskset`` may allow fewer CPUs than the host has; a
    worker per host CPU would then only take turns on the allowed ones. At
    most as many as ``--workers`` accepts.
    """
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    cpus = len(usable) if usable is not None else os.cpu_count() or 1
    return min(cpus, MAX_WORKERS)


def _waits_that_fit(asked: int | None) -> int:
    """The long-polls each worker may hold, within the open-file limit.

    Each held poll is an open socket. The soft limit is raised to the hard
    one (often 1,024 soft and far more hard); the default shrinks to what
    then fits, and a number asked for that does not fit is refused.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    limit = MAX_FILES if soft == resource.RLIM_INFINITY else soft
    fits = max(limit - server.ORDINARY_CONNECTIONS - FILES_BESIDE_CONNECTIONS, 0)
    if asked is not None:
        if asked > fits:
            cli.fail(f"--waits {asked:,} does not fit the open-file limit of {limit:,} "
                     f"(at most {fits:,}); raise it (ulimit -n, LimitNOFILE=) or ask for fewer")
        return asked
    if fits < DEFAULT_WAITS:
        log.warning("each worker holds at most %d long-polls: the open-file limit is %d; "
                    "raise it (ulimit -n, LimitNOFILE=) to hold %d", max(fits, 1), limit,
                    DEFAULT_WAITS)
    return max(1, min(DEFAULT_WAITS, fits))


def _say_how_api_limits_count(settings: Settings, workers: int) -> None:
    """Say once at start what the API rate limits mean with this many workers."""
    if workers > 1 and ratelimit.counts_per_process(settings):
        log.info("API rate limits are counted in each worker's memory: with %d workers a "
                 "client may get up to %d times each limit; set "
                 "GATEWAY_RATELIMIT_STORAGE_URL (redis://...) to count them exactly. The "
                 "login lockout counts in the database and is exact.", workers, workers)


def _check_secrets_and_destinations(settings: Settings) -> OutboundPolicy:
    """The outbound policy, once the keyring, the catalog and the issuer are found fine.

    Read once at start-up, so a bad keyring or catalog, or a destination the
    outbound guard will refuse, stops the command with one line instead of
    failing some user's request later.
    """
    try:
        load_keyring(settings)
        policy = OutboundPolicy.from_settings(settings)
    except (KeyringError, SettingsError) as error:
        cli.fail(str(error))
    _report([*preflight.catalog_problems(settings, policy),
             *preflight.issuer_problems(settings, policy, reach=False)])
    return policy


def _check_what_may_fail_later(settings: Settings, policy: OutboundPolicy) -> None:
    """Warn of clients' webhook URLs the guard refuses and of silent providers; refuse an
    OAuth provider whose discovery document the gateway cannot work with."""
    engine = make_engine(settings.database_url)
    try:
        webhooks = preflight.webhook_problems(engine, policy)
    finally:
        engine.dispose()
    _report([*preflight.issuer_problems(settings, policy, reach=True),
             *preflight.oauth_problems(settings), *webhooks])


def _report(problems: list[preflight.Problem]) -> None:
    """A warning for each problem the gateway can start with; one line for those it cannot."""
    for problem in problems:
        if not problem.refuses_start:
            log.warning("%s", problem)
    refusing = [problem for problem in problems if problem.refuses_start]
    if len(refusing) > 1:
        cli.fail(f"{refusing[0]} (and {len(refusing) - 1} more: `gateway status` lists them)")
    if refusing:
        cli.fail(str(refusing[0]))


def _tls_files(settings: Settings, certfile: Path | None,
               keyfile: Path | None) -> tuple[Path, Path]:
    if bool(certfile) != bool(keyfile):
        cli.fail("pass both --certfile and --keyfile, or neither")
    certfile = certfile or settings.tls_certfile
    keyfile = keyfile or settings.tls_keyfile
    try:
        if certfile and keyfile:
            pair = (certfile, keyfile)
        elif settings.public_host in LOCAL_HOSTS:
            pair = tls.ensure_dev_certificate(settings.instance_path)
        else:
            cli.fail(f"no TLS certificate for {settings.public_host}: set "
                     "GATEWAY_TLS_CERTFILE and GATEWAY_TLS_KEYFILE, or pass --certfile "
                     "and --keyfile")
        tls.check_certificate_pair(*pair)
    except FileError as error:
        cli.fail(str(error))
    return pair


def _check_database(settings: Settings, workers: int) -> None:
    engine = make_engine(settings.database_url)
    try:
        current = migrations.is_current(engine)
        _warn_if_connections_may_run_out(engine, workers)
    except SQLAlchemyError as error:
        cli.fail(f"database unreachable ({error.__class__.__name__}); "
                 "check GATEWAY_DATABASE_URL")
    finally:
        engine.dispose()
    if not current:
        cli.fail("the database schema is not current; run `gateway db upgrade` first")


def _warn_if_connections_may_run_out(engine: Engine, workers: int) -> None:
    """Warn when the workers may need more PostgreSQL connections than the server has free.

    Past its limit PostgreSQL refuses new connections, and the requests that
    needed them answer 503: better said once at start than found under load.
    """
    if engine.dialect.name != "postgresql":
        return
    try:
        with engine.connect() as connection:
            limit, reserved, in_use = connection.execute(text(
                "SELECT current_setting('max_connections')::int, "
                "current_setting('superuser_reserved_connections')::int, "
                "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')",
            )).one()
    except SQLAlchemyError as error:
        # Only advice: a server that will not tell (a proxy in front of it)
        # does not stop the gateway from starting.
        log.info("PostgreSQL's connection limit is unknown (%s)", type(error).__name__)
        return
    free = limit - reserved - in_use + 1  # this check's own connection closes now
    most = workers * POSTGRES_CONNECTIONS_PER_PROCESS
    if most > free:
        log.warning(
            "PostgreSQL has %d connections free (max_connections %d, %d reserved, %d in "
            "use), and %d workers may open up to %d under load (%d each); requests past "
            "the limit will answer 503. Start fewer workers, or raise max_connections.",
            free, limit, reserved, in_use - 1, workers, most, POSTGRES_CONNECTIONS_PER_PROCESS)


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                cli.fail(f"port {port} on {host} is already in use")
            cli.fail(f"cannot listen on {host}:{port}: {error.strerror}")
