"""The JSON shapes of the credentials API, for its OpenAPI document."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from gateway.elicitations.schemas import Subject

CREDENTIAL_ID = r"^cr_[A-Za-z0-9_-]{1,37}$"


class CredentialView(BaseModel):
    """A stored credential's metadata; never the secret."""

    id: str
    type: str
    kind: Literal["api_key", "oauth"]
    hint: Annotated[str | None, Field(description="The last characters of a key, or the "
                                                  "account of a connection, to recognise it; "
                                                  "null for a type that keeps no hint")]
    status: Literal["active", "revoked"]
    subject: Subject
    elicitation_id: str
    created_at: str
    revoked_at: str | None
    revoked_reason: Annotated[
        Literal["user", "client", "operator", "superseded", "refresh-failed"] | None,
        Field(description="Who or what revoked it")]
    account: Annotated[str | None, Field(description="oauth: the account the user connected")]
    scopes: Annotated[list[str] | None, Field(description="oauth: the scopes granted")]


class CredentialPage(BaseModel):
    """One page of a listing."""

    items: list[CredentialView]
    next_cursor: Annotated[str | None, Field(description="Pass as ?cursor= for the next page")]


class RevealedCredential(BaseModel):
    """The plaintext key, or a connection's access token, for the client that asked for it.

    An OAuth connection's answer adds the last four fields; an API key's never has them.
    """

    id: str
    type: str
    secret: Annotated[str, Field(description="The key; for an OAuth connection its access "
                                             "token, refreshed first if it was about to expire")]
    token_type: Annotated[str | None, Field(description="OAuth: how to send the token, "
                                                        "usually Bearer")] = None
    expires_at: Annotated[str | None, Field(description="OAuth: when the access token "
                                                        "expires; null if the provider did "
                                                        "not say")] = None
    scopes: Annotated[list[str] | None, Field(description="OAuth: the scopes granted")] = None
    account: Annotated[str | None, Field(description="OAuth: the account connected, as the "
                                                     "provider names it")] = None
