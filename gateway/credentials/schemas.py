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
    hint: Annotated[str, Field(description="The last characters of a key, or the account "
                                           "of a connection, to recognise it")]
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
    """The plaintext key, for the client that asked for it."""

    id: str
    type: str
    secret: str
