"""``gateway users``: local accounts (login backend ``local``), and anyone's sessions."""

from __future__ import annotations

import sys

import click

from gateway import cli
from gateway.clock import SystemClock
from gateway.identity import service
from gateway.identity.sessions import Subject
from gateway.pagination import timestamp

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
stdin_option = click.option("--password-stdin", is_flag=True,
                            help="Read the password from the first line of standard input.")


def _password(from_stdin: bool) -> str:
    if from_stdin:
        # One line, without its newline: what `echo "$PW" | gateway users ...` sends.
        return sys.stdin.readline().rstrip("\r\n")
    password: str = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    return password


@click.group(cls=cli.Group)
def users() -> None:
    """Local accounts that log in to the portal, and the sessions of every user."""


@users.command()
@click.argument("username")
@stdin_option
@json_option
def create(username: str, password_stdin: bool, as_json: bool) -> None:
    """Add a local account; its subject is (this gateway's public URL, USERNAME)."""
    settings = cli.settings()
    password = _password(password_stdin)
    with cli.transaction() as session:
        user = service.create_user(session, SystemClock(), username=username,
                                   password=password, actor=cli.operator())
    subject = service.local_subject(settings.public_url, user.username)
    if as_json:
        cli.echo_json({"username": user.username,
                       "subject": {"iss": subject.iss, "sub": subject.sub}})
        return
    click.echo(f"user {user.username} created")
    click.echo(f"subject: iss={subject.iss} sub={subject.sub}")


@users.command(name="list")
@json_option
def list_users(as_json: bool) -> None:
    """Every local account."""
    with cli.transaction() as session:
        rows = [{"username": u.username, "status": u.status,
                 "created_at": timestamp(u.created_at),
                 "password_changed_at": timestamp(u.password_changed_at)}
                for u in service.list_users(session)]
    if as_json:
        cli.echo_json(rows)
    else:
        cli.echo_table(rows, ["username", "status", "created_at", "password_changed_at"])


@users.command()
@click.argument("username")
def disable(username: str) -> None:
    """Disable an account; its sessions end at once."""
    settings = cli.settings()
    with cli.transaction() as session:
        ended = service.disable_user(session, SystemClock(), username=username,
                                     public_url=settings.public_url, actor=cli.operator())
    click.echo(f"user {username} disabled; {ended} session(s) ended")


@users.command(name="reset-password")
@click.argument("username")
@stdin_option
def reset_password(username: str, password_stdin: bool) -> None:
    """Set a new password; the user's sessions end at once."""
    settings = cli.settings()
    password = _password(password_stdin)
    with cli.transaction() as session:
        service.reset_password(session, SystemClock(), username=username, password=password,
                               public_url=settings.public_url, actor=cli.operator())
    click.echo(f"password of {username} changed; their sessions have ended")


@users.command(name="end-sessions")
@click.argument("sub")
@click.option("--iss", help="The subject's issuer. Default: the login backend's, "
                            "GATEWAY_OIDC_ISSUER for oidc and GATEWAY_PUBLIC_URL for local.")
@json_option
def end_sessions(sub: str, iss: str | None, as_json: bool) -> None:
    """End every browser session of the user SUB at once, local or OpenID Connect.

    SUB is the subject's sub: a local account's username, or the sub an
    OpenID Connect provider names the user by (the ID token's, as the audit
    trail shows it). An OpenID Connect user can log in again as long as the
    provider lets them: disable them there first.
    """
    settings = cli.settings()
    if iss is None:
        iss = settings.oidc_issuer if settings.login_backend == "oidc" else settings.public_url
    assert iss is not None  # settings require an issuer with the oidc backend
    subject = Subject(iss, sub)
    with cli.transaction() as session:
        ended = service.end_subject_sessions(session, SystemClock(), subject=subject,
                                             actor=cli.operator())
    if as_json:
        cli.echo_json({"subject": {"iss": subject.iss, "sub": subject.sub},
                       "sessions_ended": ended})
        return
    click.echo(f"{ended} session(s) of {sub} at {iss} ended")
