"""Login and logout pages, for whichever backend the settings chose."""

from __future__ import annotations

from flask import Blueprint, redirect, render_template, request
from werkzeug.wrappers import Response

from gateway import db
from gateway.audit import service as audit
from gateway.identity import lockout, oidc, service
from gateway.identity.web import (
    actor_of,
    current_lockout,
    current_subject,
    log_in,
    log_out,
    safe_next,
)
from gateway.web import ratelimit
from gateway.web.context import current_clock, current_settings

blueprint = Blueprint("identity", __name__)


@blueprint.get("/login")
def login() -> Response | str:
    """The login form (local accounts), or off to the identity provider (OpenID Connect)."""
    next_path = safe_next(request.args.get("next"))
    if current_settings().login_backend == "oidc":
        return oidc.start_login(next_path)
    return render_template("login.html", next_path=next_path, error=None)


@blueprint.post("/login")
def login_submit() -> Response | tuple[str, int]:
    """Check a local account's password; on success the session gets a new id."""
    next_path = safe_next(request.form.get("next"))
    if current_settings().login_backend != "local":
        return redirect(f"/login?next={next_path}", code=303)
    username = request.form.get("username", "")
    reservation = _reserve_attempt(username)
    with db.transaction() as session:
        user = service.check_local_login(
            session, current_clock(), username=username, password=request.form.get("password", ""),
            source_ip=request.remote_addr)
        if user is not None:
            subject = service.local_subject(current_settings().public_url, user.username)
            audit.record(session, current_clock(), actor=actor_of(subject), action="login",
                         target=user.username, source_ip=request.remote_addr,
                         details={"backend": "local"})
            # The lockout holds failures; this attempt was counted before its check.
            current_lockout().give_back(session, reservation)
    if user is None:
        page = render_template("login.html", next_path=next_path, username=username[:64],
                               error="The user name or password is not right.")
        return page, 401
    log_in(subject)
    return redirect(next_path, code=303)


def _reserve_attempt(username: str) -> lockout.Reservation:
    """This attempt's place in the lockout's windows, committed before any password is checked."""
    try:
        return current_lockout().reserve(db.transaction, current_clock().now(),
                                         username=username, address=ratelimit.source_address())
    except lockout.LockedOut as refused:
        ratelimit.count_refusal(refused.scope)
        raise


@blueprint.get("/login/callback")
def login_callback() -> Response:
    """Back from the identity provider: check everything, then log the user in."""
    try:
        subject, next_path = oidc.finish_login()
    except oidc.LoginRefused as refused:
        with db.transaction() as session:
            oidc.record_failure(session, current_clock(), refused,
                                source_ip=request.remote_addr)
        raise
    with db.transaction() as session:
        oidc.record_login(session, current_clock(), subject, source_ip=request.remote_addr)
    log_in(subject)
    return redirect(next_path, code=303)


@blueprint.get("/logout")
def logout_page() -> str:
    """A button to log out (logging out changes state, so it is a POST)."""
    return render_template("logout.html", subject=current_subject())


@blueprint.post("/logout")
def logout() -> Response:
    """End the session for good: its row is deleted, a copied cookie stops working."""
    subject = current_subject()
    if subject is not None:
        with db.transaction() as session:
            audit.record(session, current_clock(), actor=actor_of(subject), action="logout",
                         target=subject.sub, source_ip=request.remote_addr)
    log_out()
    return redirect("/logout/done", code=303)


@blueprint.get("/logout/done")
def logged_out() -> str:
    """Confirmation that the session has ended."""
    return render_template("logged_out.html")
