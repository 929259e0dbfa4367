"""Stripe, behind the small interface the gateway needs of it.

:class:`Stripe` is what the services call: create and read a Checkout
Session, check the signature of an event. :class:`StripeApi` is the real
one, built on the ``stripe`` library, whose HTTP goes through the gateway's
SSRF-guarded session (https only, no proxies, no redirects followed) like
every other outbound call. :class:`NoStripe` stands in when the operator set
no Stripe keys: every call says payments are not configured.
:func:`from_settings` picks one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import stripe

from gateway.errors import GatewayError
from gateway.outbound import BlockedDestination, OutboundPolicy, guarded_session
from gateway.settings import Settings, SettingsError, env_name

log = logging.getLogger(__name__)

# Where Stripe's hosted Checkout lives; the checkout pages may post (and be
# redirected) there, and nowhere else outside the gateway.
CHECKOUT_ORIGIN: Final = "https://checkout.stripe.com"
# Stripe signs each event with a timestamp; older than this, it may be a replay.
SIGNATURE_TOLERANCE_SECONDS: Final = 300
# Connect and read timeouts: Stripe answers in well under a second; the user waits.
TIMEOUT: Final = (5.0, 30.0)
# Network failures and 409 "in progress" answers are retried by the library
# with the same Idempotency-Key, so a retry cannot make a second session.
NETWORK_RETRIES: Final = 2


class PaymentsNotConfigured(GatewayError):
    status = 404
    code = "payments-not-configured"
    title = "Payments are not configured"


class StripeUnavailable(GatewayError):
    """Stripe could not be reached or refused the request; nothing was paid."""

    status = 502
    code = "stripe-unavailable"
    title = "Payment service unavailable"


class InvalidSignature(GatewayError):
    status = 400
    code = "invalid-signature"
    title = "Invalid Stripe-Signature"


@dataclass(frozen=True, slots=True)
class CheckoutRequest:
    """Everything the gateway asks Stripe for when it starts a Checkout Session."""

    idempotency_key: str
    mode: str
    line_item: dict[str, Any]
    client_reference_id: str
    metadata: dict[str, str]
    success_url: str
    cancel_url: str
    expires_at: int  # Unix seconds
    customer_email: str | None = None

    def params(self) -> dict[str, Any]:
        """The body of ``POST /v1/checkout/sessions``."""
        params: dict[str, Any] = {
            "mode": self.mode,
            "line_items": [self.line_item],
            "client_reference_id": self.client_reference_id,
            "metadata": self.metadata,
            "success_url": self.success_url,
            "cancel_url": self.cancel_url,
            "expires_at": self.expires_at,
        }
        # The ids ride along on the PaymentIntent or Subscription too, so the
        # operator finds the elicitation from any object in Stripe's dashboard.
        if self.mode == "subscription":
            params["subscription_data"] = {"metadata": self.metadata}
        else:
            params["payment_intent_data"] = {"metadata": self.metadata}
        if self.customer_email:
            params["customer_email"] = self.customer_email
        return params


@dataclass(frozen=True, slots=True)
class CheckoutSession:
    """The parts of a Stripe Checkout Session the gateway acts on."""

    id: str
    status: str | None  # open | complete | expired
    payment_status: str | None  # paid | unpaid | no_payment_required
    url: str | None = None
    mode: str | None = None
    amount_total: int | None = None
    currency: str | None = None
    payment_intent_id: str | None = None
    subscription_id: str | None = None
    client_reference_id: str | None = None
    expires_at: int | None = None

    @classmethod
    def from_stripe(cls, data: Mapping[str, Any]) -> CheckoutSession:
        """Read a session as Stripe's API or an event's ``data.object`` spells it."""
        session_id = data.get("id")
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("a Checkout Session without an id")
        return cls(
            id=session_id,
            status=_text(data.get("status")),
            payment_status=_text(data.get("payment_status")),
            url=_text(data.get("url")),
            mode=_text(data.get("mode")),
            amount_total=_integer(data.get("amount_total")),
            currency=_text(data.get("currency")),
            payment_intent_id=_object_id(data.get("payment_intent")),
            subscription_id=_object_id(data.get("subscription")),
            client_reference_id=_text(data.get("client_reference_id")),
            expires_at=_integer(data.get("expires_at")),
        )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _object_id(value: Any) -> str | None:
    # An id, or the whole object when the request expanded it.
    if isinstance(value, Mapping):
        return _text(value.get("id"))
    return _text(value)


class Stripe(Protocol):
    """What the gateway needs of Stripe."""

    def create_checkout_session(self, request: CheckoutRequest) -> CheckoutSession:
        """Start a Checkout Session; the same idempotency key returns the same session."""
        ...

    def retrieve_checkout_session(self, session_id: str) -> CheckoutSession:
        """A Checkout Session as Stripe sees it now."""
        ...

    def verify_event(self, payload: bytes, signature: str | None) -> dict[str, Any]:
        """The event in ``payload`` if ``signature`` is Stripe's; InvalidSignature otherwise."""
        ...


class StripeApi:
    """The real Stripe, through the guarded HTTP session."""

    def __init__(self, secret_key: str, webhook_secret: str, policy: OutboundPolicy,
                 api_base: str | None = None) -> None:
        http = stripe.RequestsClient(timeout=TIMEOUT, session=guarded_session(policy))
        self._client = stripe.StripeClient(
            secret_key, http_client=http, max_network_retries=NETWORK_RETRIES,
            base_addresses={"api": api_base} if api_base else None)
        self._webhook_secret = webhook_secret

    def create_checkout_session(self, request: CheckoutRequest) -> CheckoutSession:
        """``POST /v1/checkout/sessions`` with the request's Idempotency-Key."""
        params: Any = request.params()  # a TypedDict in the library; built as plain data here
        with _translated_errors("start the payment"):
            created = self._client.v1.checkout.sessions.create(
                params, {"idempotency_key": request.idempotency_key})
        return CheckoutSession.from_stripe(created.to_dict())

    def retrieve_checkout_session(self, session_id: str) -> CheckoutSession:
        """``GET /v1/checkout/sessions/{id}``."""
        with _translated_errors("check the payment"):
            found = self._client.v1.checkout.sessions.retrieve(session_id)
        return CheckoutSession.from_stripe(found.to_dict())

    def verify_event(self, payload: bytes, signature: str | None) -> dict[str, Any]:
        """Check ``Stripe-Signature`` over the raw body, with Stripe's own verifier."""
        try:
            stripe.WebhookSignature.verify_header(
                payload, signature, self._webhook_secret,
                tolerance=SIGNATURE_TOLERANCE_SECONDS)
        except stripe.SignatureVerificationError as error:
            raise InvalidSignature(_signature_problem(str(error))) from None
        try:
            event = json.loads(payload)
        except (UnicodeDecodeError, ValueError):
            raise InvalidSignature("the signed body is not JSON") from None
        if not isinstance(event, dict):
            raise InvalidSignature("the signed body is not a Stripe event")
        return event


def _signature_problem(message: str) -> str:
    # The library's words, shortened to what a sender can act on; never the
    # expected signature.
    if "No Stripe-Signature" in message:
        return "the Stripe-Signature header is missing"
    if "tolerance" in message:
        return "the signature is too old; a replayed event is refused"
    return "the Stripe-Signature header does not match the body"


@contextmanager
def _translated_errors(doing: str) -> Iterator[None]:
    """Turn the library's and the guard's failures into one domain error."""
    try:
        yield
    except stripe.InvalidRequestError as error:
        # Stripe understood and refused (an amount under its minimum, a price
        # that does not exist): trying again will not help, the app must fix it.
        log.warning("Stripe refused a request (%s): %s", doing, error)
        raise StripeUnavailable(f"Stripe refused to {doing} as the app asked for it. Nothing "
                                "was charged. Go back to the app.") from None
    except (stripe.StripeError, BlockedDestination) as error:
        # The full story goes to the log; the user learns only that nothing
        # was charged and that trying again is safe.
        log.warning("Stripe call failed (%s): %s", doing, error)
        raise StripeUnavailable(f"We could not {doing} with Stripe just now. Nothing was "
                                "charged. Try again in a minute.") from None


class NoStripe:
    """Stands in for Stripe where the operator configured none."""

    def _refuse(self) -> PaymentsNotConfigured:
        return PaymentsNotConfigured("this gateway takes no payments: its operator has not set "
                                     "GATEWAY_STRIPE_SECRET_KEY")

    def create_checkout_session(self, request: CheckoutRequest) -> CheckoutSession:
        raise self._refuse()

    def retrieve_checkout_session(self, session_id: str) -> CheckoutSession:
        raise self._refuse()

    def verify_event(self, payload: bytes, signature: str | None) -> dict[str, Any]:
        raise self._refuse()


def from_settings(settings: Settings) -> Stripe:
    """The Stripe of these settings: the real API when keys are set, NoStripe otherwise."""
    if settings.stripe_secret_key is None or settings.stripe_webhook_secret is None:
        return NoStripe()
    policy = OutboundPolicy.from_settings(settings)
    api_base = settings.stripe_api_base
    if api_base:
        api_base = check_api_base(api_base, policy)
    return StripeApi(settings.stripe_secret_key.reveal(),
                     settings.stripe_webhook_secret.reveal(), policy, api_base)


def check_api_base(url: str, policy: OutboundPolicy) -> str:
    """An origin to send Stripe's API calls to; plain http only to a listed development host."""
    key = env_name("stripe_api_base")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise SettingsError(key, f"not a URL: {url!r}") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise SettingsError(key, f"must be an https:// origin, got {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise SettingsError(key, "must be an origin only, no path or query")
    if parts.scheme == "http" and not policy.allows_insecure(
            parts.hostname, port or 80):
        raise SettingsError(key, "plain http only to a host:port listed in "
                                 f"{env_name('outbound_allow_insecure_hosts')}")
    return f"{parts.scheme}://{parts.netloc}"
