"""Typed views of what the gateway's API returns.

Built from JSON by ``from_json``; unknown fields are ignored, so a newer
gateway that adds fields does not break an older client.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar

ElicitationStatus = Literal["pending", "opened", "completed", "declined", "failed", "expired",
                            "cancelled"]
TERMINAL: Final[frozenset[str]] = frozenset(
    {"completed", "declined", "failed", "expired", "cancelled"})
ElicitationKind = Literal["api_key", "oauth", "payment"]
CredentialKind = Literal["api_key", "oauth"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Subject:
    """A user as the MCP server's authorization server names them: ``(iss, sub)``."""

    iss: str
    sub: str

    def to_json(self) -> dict[str, str]:
        return {"iss": self.iss, "sub": self.sub}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Subject:
        return cls(iss=str(data["iss"]), sub=str(data["sub"]))


@dataclass(frozen=True, slots=True)
class Elicitation:
    """One elicitation: its link, its state and what it asks for."""

    id: str
    url: str
    status: ElicitationStatus
    kind: ElicitationKind
    subject: Subject
    message: str
    expires_at: str
    credential_type: str | None = None
    scopes: list[str] | None = None  # oauth: the scopes asked for
    payment: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: str | None = None
    opened_at: str | None = None
    ended_at: str | None = None
    # ElicitRequestURLParams (MCP 2025-11-25), as the gateway built it.
    mcp: dict[str, Any] = field(default_factory=dict)
    # True for a 201 (a new elicitation, or the gateway's replay of the answer
    # that made it, for a repeated Idempotency-Key); False for a 200: a
    # still-open elicitation came back instead (reuse_pending).
    created: bool = False

    @property
    def is_terminal(self) -> bool:
        """Whether it has ended (completed, declined, failed, expired or cancelled)."""
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, created: bool = False) -> Elicitation:
        return cls(
            id=data["id"], url=data["url"], status=data["status"], kind=data["kind"],
            subject=Subject.from_json(data["subject"]), message=data["message"],
            expires_at=data["expires_at"], credential_type=data.get("credential_type"),
            scopes=_strings(data.get("scopes")), payment=data.get("payment"),
            metadata=dict(data.get("metadata") or {}),
            created_at=data.get("created_at"), opened_at=data.get("opened_at"),
            ended_at=data.get("ended_at"), mcp=dict(data.get("mcp") or {}), created=created)


@dataclass(frozen=True, slots=True)
class Credential:
    """A stored credential's metadata; never its secret.

    ``kind`` is ``api_key`` or ``oauth``; an OAuth connection also names the
    ``account`` the user connected and the ``scopes`` the provider granted.
    """

    id: str
    type: str
    hint: str | None  # None for a type that keeps no hint
    status: Literal["active", "revoked"]
    subject: Subject
    elicitation_id: str
    created_at: str
    revoked_at: str | None = None
    # user, client, operator, superseded or refresh-failed
    revoked_reason: str | None = None
    kind: CredentialKind = "api_key"
    account: str | None = None
    scopes: list[str] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Credential:
        return cls(
            id=data["id"], type=data["type"], hint=data["hint"], status=data["status"],
            subject=Subject.from_json(data["subject"]), elicitation_id=data["elicitation_id"],
            created_at=data["created_at"], revoked_at=data.get("revoked_at"),
            revoked_reason=data.get("revoked_reason"), kind=data.get("kind") or "api_key",
            account=data.get("account"), scopes=_strings(data.get("scopes")))


@dataclass(frozen=True, slots=True)
class RevealedCredential:
    """A credential's plaintext secret. Its repr masks the secret, so a log line cannot leak it.

    For an OAuth connection ``secret`` is a working access token (the
    gateway refreshes it first when it is about to expire), sent as
    ``Authorization: <token_type> <secret>``; ``expires_at`` (ISO 8601, or
    None when the provider gave no lifetime), ``scopes`` and ``account``
    come with it. An API key leaves those four None.
    """

    id: str
    type: str
    secret: str = field(repr=False)
    token_type: str | None = None
    expires_at: str | None = None
    scopes: list[str] | None = None
    account: str | None = None

    def __repr__(self) -> str:
        return f"RevealedCredential(id={self.id!r}, type={self.type!r}, secret='***')"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RevealedCredential:
        return cls(id=data["id"], type=data["type"], secret=data["secret"],
                   token_type=data.get("token_type"), expires_at=data.get("expires_at"),
                   scopes=_strings(data.get("scopes")), account=data.get("account"))


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing; pass ``next_cursor`` back as ``cursor`` for the next."""

    items: list[T]
    next_cursor: str | None

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _strings(value: Any) -> list[str] | None:
    return None if value is None else [str(item) for item in value]
