"""``gateway demo``: the whole flow on the embedded default, in one command.

It sets up whatever is missing (instance folder, schema), registers a demo
MCP server whose webhooks go to a small receiver in this process (which
verifies each delivery and prints it), creates a local user, and makes one
API-key elicitation for them, then serves HTTPS. Open the printed link, log
in with the printed user, enter any key, and watch the verified webhook
arrive. Run again on the same instance, it keeps the one MCP server and the
one user: the server's webhooks go to the new run's receiver, and the user
gets a fresh password.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import tomllib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import click
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway import cli, migrations
from gateway.client.webhooks import WebhookVerificationError, verify_webhook
from gateway.clients import service as clients
from gateway.clients.models import Client, ClientIdentity
from gateway.clock import SystemClock
from gateway.credentials.catalog import catalog_of
from gateway.db import make_engine
from gateway.elicitations import service as elicitations
from gateway.elicitations.schemas import create_adapter
from gateway.files import FileError
from gateway.identity import service as identity
from gateway.identity.models import User
from gateway.instance import config_path, create_instance, set_config_values
from gateway.outbound import OutboundPolicy
from gateway.settings import Settings, SettingsError, env_name, load_settings
from gateway.vault import versions
from gateway.vault.keyring import KeySource

DEMO_USER = "demo"
DEMO_CLIENT = "Demo MCP server"
# The origins the demo may take over: an instance made for this machine only.
LOCAL_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True, slots=True)
class Seeded:
    """What the demo set up: the link (none with OpenID Connect), the user's password
    and the demo server's webhook secret."""

    link: str | None
    password: str
    webhook_secret: str


class Receiver(BaseHTTPRequestHandler):
    """The demo MCP server's webhook endpoint: verify, then print."""

    secret = ""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            event = verify_webhook(self.secret, dict(self.headers), body)
        except WebhookVerificationError as error:
            click.secho(f"webhook REFUSED: {error}", fg="red")
            self.send_response(400)
        else:
            click.secho(f"webhook verified: {event['type']} "
                        f"{json.dumps(event['data'], ensure_ascii=False)}", fg="green")
            self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _start_receiver(secret: str) -> str:
    Receiver.secret = secret
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, name="demo-receiver", daemon=True).start()
    return f"127.0.0.1:{server.server_address[1]}"


def _prepare_environment(public_url: str) -> None:
    # The demo's own settings win over the config file: its origin follows
    # --port, and only the receiver in this process may be called over http.
    os.environ[env_name("public_url")] = public_url
    if not config_path().exists():
        try:
            for path in create_instance(public_url):
                click.echo(f"wrote {path} (mode 0600)")
        except (SettingsError, FileError) as error:
            cli.fail(str(error))
    configured = _config_file().get("public_url", public_url)
    if urlsplit(str(configured)).hostname not in LOCAL_HOSTS:
        cli.fail(f"{config_path()} is set up for {configured}; the demo serves {public_url} "
                 "and registers a demo server and user: run it on an instance of its own "
                 f"(set {env_name('instance_path')} to another folder)")


def _config_file() -> dict[str, Any]:
    try:
        return tomllib.loads(config_path().read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        cli.fail(f"cannot read {config_path()}: {error}")


def _previous_receiver() -> str | None:
    """Where the demo server's webhooks went on the last run (``host:port``), if any.

    Migrates the database first: on the first run it is new.
    """
    engine = make_engine(_load_settings().database_url)
    try:
        migrations.upgrade(engine)
        with Session(engine) as session:
            url = session.scalar(select(Client.webhook_url).where(Client.name == DEMO_CLIENT))
    finally:
        engine.dispose()
    return urlsplit(url).netloc if url else None


def _load_settings() -> Settings:
    """The settings as they stand now (``cli.settings()`` keeps the first it read)."""
    try:
        return load_settings()
    except (SettingsError, FileError) as error:
        cli.fail(str(error))


def _keep_in_config(public_url: str, receiver: str, previous: str | None) -> None:
    """Write the demo's origin and receiver into the instance's config file.

    Every other command run in this folder (``gateway status``, ``gateway
    clients``) then sees what the demo serves with: its origin, and its
    receiver among the hosts that may be called over http. The previous
    run's receiver leaves the list, so it does not grow with every run.
    """
    allowed = [host for host in _config_file().get("outbound_allow_insecure_hosts", [])
               if host not in (previous, receiver)]
    try:
        set_config_values({"public_url": public_url,
                           "outbound_allow_insecure_hosts": (*allowed, receiver)})
    except (OSError, FileError) as error:
        cli.fail(f"cannot keep the demo's settings in {config_path()}: {error}")


def _allow(receiver: str, previous: str | None) -> None:
    """Let outbound calls reach the receiver over plain http, beside the hosts already allowed.

    Those are the environment's list if it has one, else the config file's
    (an OpenID Connect provider or an MCP server on this machine, say). The
    environment wins over the file, so the receiver joins whichever list is
    in force, or it would drop the file's; the previous run's receiver leaves it.
    """
    allowed = [host for host in _load_settings().outbound_allow_insecure_hosts
               if host not in (previous, receiver)]
    os.environ[env_name("outbound_allow_insecure_hosts")] = ",".join((*allowed, receiver))


def _user(session: Session, password: str) -> None:
    clock = SystemClock()
    if session.scalar(select(User.id).where(User.username == DEMO_USER)) is None:
        identity.create_user(session, clock, username=DEMO_USER, password=password,
                             actor=cli.operator())
    else:
        identity.reset_password(session, clock, username=DEMO_USER, password=password,
                                public_url=cli.settings().public_url, actor=cli.operator())


def _seed(settings: Settings, webhook_url: str) -> Seeded:
    """Client, user and elicitation.

    With the OpenID Connect login there is no user and no link: the users are
    the provider's, and the demo knows none of them to ask.
    """
    engine = make_engine(settings.database_url)
    password = secrets.token_urlsafe(12)
    link: str | None = None
    keyring = versions.for_command(settings, engine, SystemClock(), role="demo")
    # Read (and the version it wraps with listed) before the transaction: on
    # SQLite that transaction holds the one write lock when the secret is sealed.
    keyring.refresh()
    with sessionmaker(engine, expire_on_commit=False).begin() as session:
        client, webhook_secret = _demo_client(session, settings, keyring, webhook_url)
        if settings.login_backend == "local":
            _user(session, password)
            link = _ask_demo_user(session, settings, clients.identity_of(client))
    engine.dispose()
    return Seeded(link, password, webhook_secret)


def _demo_client(session: Session, settings: Settings, keyring: KeySource,
                 webhook_url: str) -> tuple[Client, str]:
    """The demo's MCP server, aimed at this run's receiver; its webhook secret.

    One registration across runs: made on the first, and on each later one
    pointed at the new receiver, so that webhooks still due from an earlier
    run (a retry, an elicitation that expires) arrive here, not at the port
    of a receiver that stopped with its demo.
    """
    clock, policy = SystemClock(), OutboundPolicy.from_settings(settings)
    client = session.scalar(select(Client).where(Client.name == DEMO_CLIENT))
    if client is None:
        minted = clients.create_client(
            session, clock, keyring=keyring, pepper=settings.token_pepper,
            catalog=catalog_of(settings), name=DEMO_CLIENT,
            webhook_url=webhook_url, credential_types=[], actor=cli.operator(), policy=policy)
        return minted.client, minted.webhook_secret
    clients.change_webhook_url(session, clock, client_ref=client.id, webhook_url=webhook_url,
                               actor=cli.operator(), policy=policy)
    # The newest secret: deliveries are signed with it (and any still in grace).
    return client, clients.current_webhook_secrets(session, clock, keyring, client)[0]


def _ask_demo_user(session: Session, settings: Settings, client: ClientIdentity) -> str:
    """An API-key elicitation for the demo user; its link."""
    request = create_adapter.validate_python({
        "subject": {"iss": settings.public_url, "sub": DEMO_USER}, "kind": "api_key",
        "credential_type": "generic", "ttl_seconds": 3600, "reuse_pending": False,
        "message": "The demo weather tool needs your weather-service API key. Any "
                   "key will do here; it is encrypted and never shown to the assistant."})
    outcome = elicitations.create(
        session, SystemClock(), elicitations.Caller(client, None),
        request, catalog=catalog_of(settings), payments_enabled=False,
        public_url=settings.public_url, idempotency_key=None, request_digest="")
    url: str = outcome.body["url"]
    return url


@click.command()
@click.option("--port", default=8443, show_default=True, type=click.IntRange(1, 65535))
def demo(port: int) -> None:
    """Set up what is missing and serve the whole flow: a link, a user, a webhook receiver."""
    from gateway.serving.cli import serve
    from gateway.serving.server import IN_CHILD

    public_url = f"https://localhost:{port}"
    _prepare_environment(public_url)
    # The receiver's address is known only once it listens: the worker that
    # `serve` starts reads it from the environment.
    receiver = _start_receiver("")
    previous = _previous_receiver()
    _allow(receiver, previous)
    settings = cli.settings()
    webhook_url = f"http://{receiver}/hooks"
    seeded = _seed(settings, webhook_url)
    _keep_in_config(public_url, receiver, previous)
    Receiver.secret = seeded.webhook_secret
    click.echo()
    if seeded.link is None:
        click.secho(f"The gateway demo is ready. Users log in at {settings.oidc_issuer}.",
                    bold=True)
    else:
        click.secho("The gateway demo is ready. Open the link, log in, enter any key:",
                    bold=True)
        click.echo(f"open:     {seeded.link}")
        click.echo(f"user:     {DEMO_USER}")
        click.echo(f"password: {seeded.password}")
    click.echo(f"Webhooks to the demo MCP server go to {webhook_url}; each is verified "
               "and printed below. Ctrl-C stops it.")
    click.echo()
    # Served as `gateway serve` serves by default (a worker per CPU): the demo
    # shows the embedded default, and nothing in it needs a single process
    # (the login lockout counts in the database). The receiver runs here,
    # so the server runs in a child process rather than replace this one.
    context = click.get_current_context()
    context.meta[IN_CHILD] = True
    context.invoke(serve, port=port, host="127.0.0.1", certfile=None,
                   keyfile=None, no_tls=False, no_worker=False)
