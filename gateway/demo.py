"""``gateway demo``: the whole flow on the embedded default, in one command.

It sets up whatever is missing (instance folder, schema), registers a demo
MCP server whose webhooks go to a small receiver in this process (which
verifies each delivery and prints it), creates a local user with a fresh
random password and one API-key elicitation for them, and serves HTTPS.
Open the printed link, log in with the printed user, enter any key, and
watch the verified webhook arrive.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import click
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway import cli, migrations
from gateway.client.webhooks import WebhookVerificationError, verify_webhook
from gateway.clients import service as clients
from gateway.clients.models import ClientIdentity
from gateway.clock import SystemClock
from gateway.credentials.catalog import catalog_of
from gateway.db import make_engine
from gateway.elicitations import service as elicitations
from gateway.elicitations.schemas import create_adapter
from gateway.files import FileError
from gateway.identity import service as identity
from gateway.identity.models import User
from gateway.instance import config_path, create_instance
from gateway.outbound import OutboundPolicy
from gateway.settings import Settings, SettingsError, env_name
from gateway.vault import versions

DEMO_USER = "demo"


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


def _prepare_environment(port: int) -> None:
    # The demo's own settings win over the config file: its origin follows
    # --port, and only the receiver in this process may be called over http.
    public_url = f"https://localhost:{port}"
    os.environ[env_name("public_url")] = public_url
    if not config_path().exists():
        try:
            for path in create_instance(public_url):
                click.echo(f"wrote {path} (mode 0600)")
        except (SettingsError, FileError) as error:
            cli.fail(str(error))


def _user(session: Session, password: str) -> None:
    clock = SystemClock()
    if session.scalar(select(User.id).where(User.username == DEMO_USER)) is None:
        identity.create_user(session, clock, username=DEMO_USER, password=password,
                             actor=cli.operator())
    else:
        identity.reset_password(session, clock, username=DEMO_USER, password=password,
                                public_url=cli.settings().public_url, actor=cli.operator())


def _seed(settings: Settings, receiver: str) -> tuple[str | None, str, str]:
    """Client, user and elicitation; the link, the password and the webhook secret.

    With the OpenID Connect login there is no user and no link: the users are
    the provider's, and the demo knows none of them to ask.
    """
    engine = make_engine(settings.database_url)
    migrations.upgrade(engine)
    password = secrets.token_urlsafe(12)
    clock = SystemClock()
    link: str | None = None
    with sessionmaker(engine, expire_on_commit=False).begin() as session:
        minted = clients.create_client(
            session, clock, keyring=versions.for_command(settings, engine, clock, role="demo"),
            pepper=settings.token_pepper,
            catalog=catalog_of(settings),
            name=f"Demo MCP server {datetime.now(UTC):%H%M%S}",
            webhook_url=f"http://{receiver}/hooks", credential_types=[],
            actor=cli.operator(), policy=OutboundPolicy.from_settings(settings))
        if settings.login_backend == "local":
            _user(session, password)
            link = _ask_demo_user(session, settings, clients.identity_of(minted.client))
    engine.dispose()
    return link, password, minted.webhook_secret


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

    _prepare_environment(port)
    # The receiver's address is known only once it listens: the worker that
    # `serve` starts reads it from the environment.
    probe = _start_receiver("")
    # Added to the hosts already allowed (an OpenID Connect provider or an MCP
    # server on this machine, say), not in their place.
    allowed = env_name("outbound_allow_insecure_hosts")
    os.environ[allowed] = ",".join(filter(None, (os.environ.get(allowed), probe)))
    settings = cli.settings()
    link, password, secret = _seed(settings, probe)
    Receiver.secret = secret
    click.echo()
    if link is None:
        click.secho(f"The gateway demo is ready. Users log in at {settings.oidc_issuer}.",
                    bold=True)
    else:
        click.secho("The gateway demo is ready. Open the link, log in, enter any key:",
                    bold=True)
        click.echo(f"open:     {link}")
        click.echo(f"user:     {DEMO_USER}")
        click.echo(f"password: {password}")
    click.echo("Webhooks to the demo MCP server are verified and printed below. "
               "Ctrl-C stops it.")
    click.echo()
    click.get_current_context().invoke(serve, port=port, host="127.0.0.1", workers=1,
                                       threads=32, certfile=None, keyfile=None,
                                       no_tls=False, no_worker=False)
