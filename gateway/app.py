"""The application factory: wiring only, no I/O."""

from __future__ import annotations

from flask import Flask
from flask_wtf.csrf import CSRFProtect

from gateway import db, resources, web
from gateway.clients.service import ClientNames
from gateway.clock import Clock, SystemClock
from gateway.credentials import api as credentials_api
from gateway.credentials import views as account
from gateway.elicitations import api as elicitations_api
from gateway.elicitations import views as portal
from gateway.elicitations.waiting import DEFAULT_SLOTS, WaitHub
from gateway.identity import views as identity
from gateway.identity.lockout import Lockout
from gateway.identity.sessions import ServerSessionInterface
from gateway.identity.web import LOCKOUT_EXTENSION, page_subject
from gateway.metrics import counters
from gateway.metrics import views as metrics
from gateway.oauth import views as oauth
from gateway.payments import stripe_gateway
from gateway.payments import views as payments
from gateway.payments.stripe_gateway import Stripe
from gateway.settings import Settings, load_settings
from gateway.vault import versions as key_versions
from gateway.web import api, openapi, ratelimit
from gateway.web.converters import IdConverter
from gateway.wording import with_article

MAX_REQUEST_BYTES = 64 * 1024

csrf = CSRFProtect()


def create_app(settings: Settings | None = None, *, clock: Clock | None = None,
               wait_slots: int = DEFAULT_SLOTS, stripe: Stripe | None = None) -> Flask:
    """Build the gateway app from settings (read from the environment when not given).

    ``wait_slots`` is how many long-polls each process may hold at once;
    ``stripe`` replaces the Stripe the settings choose.
    """
    settings = settings or load_settings()
    app = Flask(
        "gateway",
        template_folder=str(resources.TEMPLATES),
        static_folder=str(resources.STATIC),
    )
    app.config.update(
        SECRET_KEY=settings.secret_key.reveal(),
        MAX_CONTENT_LENGTH=MAX_REQUEST_BYTES,
        PREFERRED_URL_SCHEME="https",
        # Forms carry a CSRF token tied to the server-side session; it lives
        # as long as that session does.
        WTF_CSRF_TIME_LIMIT=None,
        # Flask-WTF's strict mode compares the Referer with the host, but every
        # page sends Referrer-Policy: no-referrer, so browsers send none. The
        # token, the SameSite cookie and the Sec-Fetch-Site check in
        # gateway.web.https stand instead.
        WTF_CSRF_SSL_STRICT=False,
    )
    app.url_map.converters["id"] = IdConverter
    app.json.sort_keys = False  # type: ignore[attr-defined]  # keep documented field order
    app.extensions["gateway.settings"] = settings
    app.extensions["gateway.clock"] = clock or SystemClock()
    app.extensions["gateway.client_names"] = ClientNames()
    app.extensions["gateway.stripe"] = stripe or stripe_gateway.from_settings(settings)
    app.jinja_env.globals["public_host"] = settings.public_host
    # What the address bar shows (the port too, unless 443): pages tell users to check it.
    app.jinja_env.globals["public_address"] = settings.public_address
    app.jinja_env.globals["page_subject"] = page_subject
    app.jinja_env.filters["with_article"] = with_article
    # Not url_for: error pages render even when the request's host was refused
    # and Flask has no URL adapter.
    app.jinja_env.globals["static_url"] = lambda name: f"{app.static_url_path}/{name}"
    db.init_app(app, settings.database_url)
    key_versions.init_app(app, settings, db.engine_of(app), app.extensions["gateway.clock"])
    # Its reads and writes are the request's unit of work (gateway.db).
    app.session_interface = ServerSessionInterface(app.extensions["gateway.clock"], settings)
    # The edge's hooks first, then the CSRF check: a request over plain HTTP
    # or a form from another site is refused for what it is, with the answer
    # that says so, before its token is even read.
    web.init_app(app, settings)
    csrf.init_app(app)
    counters.init_app(app)
    ratelimit.init_app(app, settings)
    api.init_app(app, settings, [elicitations_api.blueprint, credentials_api.blueprint,
                                 openapi.blueprint])
    app.extensions[LOCKOUT_EXTENSION] = Lockout.from_settings(settings)
    ratelimit.limit_portal(app, [identity.blueprint, oauth.blueprint], settings)
    app.register_blueprint(identity.blueprint)
    app.register_blueprint(portal.blueprint)
    app.register_blueprint(account.blueprint)
    app.register_blueprint(metrics.blueprint)
    app.register_blueprint(payments.blueprint)
    app.register_blueprint(oauth.blueprint)
    # Stripe signs its webhook (checked in the view); it has no CSRF token to send.
    csrf.exempt(payments.stripe_webhook)
    app.extensions["gateway.waits"] = WaitHub(db.engine_of(app), app.extensions["gateway.clock"],
                                              slots=wait_slots)
    return app
