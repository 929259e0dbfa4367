"""The JSON shapes of the elicitation API, validated strictly.

Unknown fields, wrong types and out-of-range values are refused with the
field named; nothing is coerced ("5" is not 5). The same models produce the
OpenAPI document, so the document cannot drift from what is enforced.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    model_validator,
)

from gateway.payments.currencies import CURRENCIES, is_known

MIN_TTL: Final = 60
MAX_TTL: Final = 24 * 3600
DEFAULT_TTL: Final = 15 * 60
MAX_METADATA_BYTES: Final = 8 * 1024
# PostgreSQL text cannot hold NUL, and no honest value needs it.
NO_NUL: Final = r"^[^\x00]*$"

# One side of an e-mail address: no "@", no space, no control character. The
# spaces are spelled out because regex engines disagree on \s (ECMA-262, which
# JSON Schema names, Rust's in pydantic and Python's each differ), so a
# client's check and ours would not agree.
_MAILBOX_PART: Final = (r"[^@\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f"
                        r"\u3000\ufeff]+")

# Elicitation ids as the gateway mints them: "el_" and URL-safe base64.
ELICITATION_ID: Final = r"^el_[A-Za-z0-9_-]{1,37}$"

NonEmpty = Annotated[str, Field(min_length=1, pattern=NO_NUL)]
# The two halves of a subject, alike in a body and in a listing's filters.
Issuer = Annotated[NonEmpty, Field(max_length=500)]
SubjectId = Annotated[NonEmpty, Field(max_length=255)]
Email = Annotated[str, Field(max_length=254, pattern=f"^{_MAILBOX_PART}@{_MAILBOX_PART}$")]


def _whole_number(value: Any) -> Any:
    # JSON has one number type: 900.0 is the number 900, and JSON Schema's
    # "integer" (which the OpenAPI document states) matches it. Only that
    # spelling is let through; "900", 900.5 and true are still refused.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Last in an Annotated, after the Field constraints, so they stay in the JSON schema.
WHOLE: Final = BeforeValidator(_whole_number)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Subject(Strict):
    """The user, as the MCP server's authorization server names them."""

    iss: Annotated[Issuer, Field(description="Issuer of the user's token")]
    sub: Annotated[SubjectId, Field(description="Subject within that issuer")]


def _known_currency(value: str) -> str:
    if not is_known(value):
        raise ValueError(f"{value!r} is not a currency Stripe charges in (ISO 4217, lower case, "
                         "e.g. 'usd', 'eur')")
    return value


Currency = Annotated[str, Field(pattern=r"^[a-z]{3}$", description="ISO 4217, lower case",
                                json_schema_extra={"enum": sorted(CURRENCIES)}),
                     AfterValidator(_known_currency)]


class AmountPayment(Strict):
    """A one-off payment of an amount the MCP server names."""

    amount: Annotated[int, Field(ge=1, le=99_999_999, description="In the currency's minor unit"),
                      WHOLE]
    currency: Currency
    description: Annotated[NonEmpty, Field(max_length=500)]
    mode: Literal["payment"] = "payment"
    customer_email: Email | None = None


class PricePayment(Strict):
    """A payment or subscription of a Stripe Price."""

    price_id: Annotated[str, Field(pattern=r"^price_[A-Za-z0-9]{1,100}$")]
    quantity: Annotated[int, Field(ge=1, le=1000), WHOLE] = 1
    mode: Literal["payment", "subscription"] = "payment"
    customer_email: Email | None = None


def _payment_shape(value: Any) -> str | None:
    # Chosen by which fields are present, so that a body with both shapes or
    # neither gets one clear sentence instead of every member's complaints.
    if not isinstance(value, dict):
        return None
    has_amount, has_price = "amount" in value, "price_id" in value
    if has_amount == has_price:
        return None
    # Tags spelled as the model names: error locations drop them like any
    # union member's name (see gateway.web.api._describe).
    return "PricePayment" if has_price else "AmountPayment"


Payment = Annotated[
    Annotated[AmountPayment, Tag("AmountPayment")]
    | Annotated[PricePayment, Tag("PricePayment")],
    Discriminator(_payment_shape, custom_error_type="payment_shape",
                  custom_error_message="give either amount, currency and description, or "
                                       "price_id (and quantity), not both"),
]


class _Common(Strict):
    subject: Subject
    message: Annotated[NonEmpty, Field(max_length=2000,
                                       description="Shown to the user on the gateway's page")]
    ttl_seconds: Annotated[int, Field(ge=MIN_TTL, le=MAX_TTL), WHOLE] = DEFAULT_TTL
    metadata: Annotated[dict[str, Any], Field(
        description="Opaque to the gateway, returned in reads and webhooks; at most 8 KiB "
                    "as JSON")] = Field(default_factory=dict)
    reuse_pending: Annotated[bool, Field(
        description="Return a still-open elicitation for the same client, subject, kind "
                    "and type instead of creating another")] = True

    @model_validator(mode="after")
    def _metadata_size(self) -> _Common:
        size = len(_METADATA.dump_json(self.metadata))
        if size > MAX_METADATA_BYTES:
            raise ValueError(f"metadata is {size} bytes as JSON; at most "
                             f"{MAX_METADATA_BYTES} are kept")
        return self


# Built once: building a TypeAdapter costs more than the validation it does.
_METADATA: Final = TypeAdapter(dict[str, Any])


class CreateApiKeyElicitation(_Common):
    """Ask the user for an API key of one credential type."""

    kind: Literal["api_key"]
    credential_type: Annotated[str, Field(min_length=1, max_length=50)]


# RFC 6749 section 3.3: a scope token is printable ASCII without space, '"' or '\\'.
ScopeName = Annotated[str, Field(pattern=r"^[\x21\x23-\x5b\x5d-\x7e]{1,200}$")]


class CreateOAuthElicitation(_Common):
    """Ask the user to connect a third-party account of one OAuth credential type."""

    kind: Literal["oauth"]
    credential_type: Annotated[str, Field(min_length=1, max_length=50)]
    scopes: Annotated[list[ScopeName] | None, Field(
        max_length=50, description="The scopes to ask for; the type's own list when left out. "
                                   "Must be among the type's scopes unless the type allows "
                                   "others")] = None


class CreatePaymentElicitation(_Common):
    """Ask the user to pay through Stripe Checkout."""

    kind: Literal["payment"]
    payment: Payment


CreateElicitation = Annotated[
    CreateApiKeyElicitation | CreateOAuthElicitation | CreatePaymentElicitation,
    Field(discriminator="kind")]
create_adapter: Final = TypeAdapter(CreateElicitation)


# --- responses (documented in OpenAPI; built by service.represent) ------------------


class McpParams(BaseModel):
    """``ElicitRequestURLParams`` of MCP 2025-11-25, ready to send as is."""

    mode: Literal["url"]
    message: str
    url: str
    elicitationId: str  # the MCP spec's spelling


class ElicitationView(BaseModel):
    """An elicitation as the API shows it."""

    id: str
    url: Annotated[str, Field(description="The link to give the user; it logs nobody in")]
    status: Literal["pending", "opened", "completed", "declined", "failed", "expired",
                    "cancelled"]
    kind: Literal["api_key", "oauth", "payment"]
    credential_type: str | None
    scopes: Annotated[list[str] | None, Field(description="oauth: the scopes asked for")]
    payment: dict[str, Any] | None
    subject: Subject
    message: str
    metadata: dict[str, Any]
    created_at: str
    expires_at: str
    opened_at: str | None
    ended_at: str | None
    mcp: McpParams


class ElicitationPage(BaseModel):
    """One page of a listing."""

    items: list[ElicitationView]
    next_cursor: Annotated[str | None, Field(description="Pass as ?cursor= for the next page")]
