"""The gateway's JSON API, as an MCP server calls it.

>>> gateway = GatewayClient("https://gateway.example.com", api_token)
>>> asked = gateway.request_api_key(Subject(iss, sub), "openai", "Connect your OpenAI key")
>>> asked.url                      # send the user here (or asked.mcp, as is)
>>> done = gateway.wait_for_elicitation(asked.id, timeout=120)

An OAuth connection is asked for the same way (``request_oauth``); revealing
it gives a working access token.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import requests

from gateway.client.errors import InvalidRequest
from gateway.client.models import (
    Credential,
    Elicitation,
    ElicitationKind,
    ElicitationStatus,
    Page,
    RevealedCredential,
    Subject,
)
from gateway.client.transport import DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT, Transport

MAX_WAIT: Final = 60
_ELICITATIONS: Final = "/api/v1/elicitations"
_CREDENTIALS: Final = "/api/v1/credentials"


class GatewayClient:
    """A typed client of one gateway, acting as one registered MCP server.

    ``verify`` is ``True`` (the system's trust store), or the path of a CA
    bundle (a development gateway's self-signed certificate, say). Calls
    that get no answer are retried ``retries`` times; error answers raise a
    :class:`~gateway.client.errors.ProblemError` subclass carrying the
    problem details.
    """

    def __init__(self, base_url: str, api_token: str, *, verify: bool | str = True,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 read_timeout: float = DEFAULT_READ_TIMEOUT, retries: int = 2,
                 session: requests.Session | None = None) -> None:
        self._http = Transport(base_url, api_token, verify=verify,
                               connect_timeout=connect_timeout, read_timeout=read_timeout,
                               retries=retries, session=session)

    def __repr__(self) -> str:
        return f"GatewayClient({self._http.base_url!r}, api_token='***')"

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close pooled connections."""
        self._http.close()

    @property
    def base_url(self) -> str:
        return self._http.base_url

    # --- elicitations ---------------------------------------------------------------

    def create_elicitation(
        self, subject: Subject, *, kind: ElicitationKind, message: str,
        credential_type: str | None = None, scopes: Sequence[str] | None = None,
        payment: Mapping[str, Any] | None = None, ttl_seconds: int | None = None,
        metadata: Mapping[str, Any] | None = None, reuse_pending: bool = True,
        idempotency_key: str | None = None,
    ) -> Elicitation:
        """Create an elicitation, or get back the still-open one it would duplicate.

        With ``reuse_pending`` (the default) an open elicitation for the same
        subject, kind and type (and the same payment, or the same scopes) comes
        back (``created`` is False) instead of a new one. Every attempt carries
        the same ``Idempotency-Key`` (a fresh random one unless given), so a
        retry after a lost answer cannot create twice.
        """
        body: dict[str, Any] = {"subject": subject.to_json(), "kind": kind, "message": message,
                                "reuse_pending": reuse_pending}
        if credential_type is not None:
            body["credential_type"] = credential_type
        if isinstance(scopes, str):
            # A lone string would go out as one scope per character.
            raise TypeError("scopes is a list of scope names, not a string")
        if scopes is not None:
            body["scopes"] = list(scopes)
        if payment is not None:
            body["payment"] = dict(payment)
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        if metadata is not None:
            body["metadata"] = dict(metadata)
        key = idempotency_key or secrets.token_urlsafe(24)
        answer = self._http.request("POST", _ELICITATIONS, body=body,
                                    headers={"Idempotency-Key": key})
        return Elicitation.from_json(answer.body, created=answer.status == 201)

    def request_api_key(
        self, subject: Subject, credential_type: str, message: str, *,
        ttl_seconds: int | None = None, metadata: Mapping[str, Any] | None = None,
        reuse_pending: bool = True, idempotency_key: str | None = None,
    ) -> Elicitation:
        """Ask ``subject`` for an API key of a type (see :meth:`create_elicitation`)."""
        return self.create_elicitation(
            subject, kind="api_key", message=message, credential_type=credential_type,
            ttl_seconds=ttl_seconds, metadata=metadata, reuse_pending=reuse_pending,
            idempotency_key=idempotency_key)

    def request_oauth(
        self, subject: Subject, credential_type: str, message: str, *,
        scopes: Sequence[str] | None = None, ttl_seconds: int | None = None,
        metadata: Mapping[str, Any] | None = None, reuse_pending: bool = True,
        idempotency_key: str | None = None,
    ) -> Elicitation:
        """Ask ``subject`` to connect an account of an OAuth type (see :meth:`create_elicitation`).

        ``scopes`` are those to ask the provider for; left out, the type's own
        list. A still-open elicitation is reused only if it asks for the same.
        """
        return self.create_elicitation(
            subject, kind="oauth", message=message, credential_type=credential_type,
            scopes=scopes, ttl_seconds=ttl_seconds, metadata=metadata,
            reuse_pending=reuse_pending, idempotency_key=idempotency_key)

    def request_payment(
        self, subject: Subject, payment: Mapping[str, Any], message: str, *,
        ttl_seconds: int | None = None, metadata: Mapping[str, Any] | None = None,
        reuse_pending: bool = True, idempotency_key: str | None = None,
    ) -> Elicitation:
        """Ask ``subject`` to pay (see :meth:`create_elicitation`).

        ``payment`` is ``{"amount", "currency", "description"}`` (minor units)
        or ``{"price_id", "quantity", "mode"}`` for a Stripe Price.
        """
        return self.create_elicitation(
            subject, kind="payment", message=message, payment=payment,
            ttl_seconds=ttl_seconds, metadata=metadata, reuse_pending=reuse_pending,
            idempotency_key=idempotency_key)

    def get_elicitation(self, elicitation_id: str, *, wait: float = 0) -> Elicitation:
        """One elicitation; with ``wait`` (at most 60 s), held until it ends or the time passes."""
        seconds = int(wait)
        if not 0 <= seconds <= MAX_WAIT:
            raise ValueError(f"wait is 0 to {MAX_WAIT} seconds")
        answer = self._http.request("GET", f"{_ELICITATIONS}/{_segment(elicitation_id)}",
                                    params={"wait": seconds or None}, extra_read_time=seconds)
        return Elicitation.from_json(answer.body)

    def wait_for_elicitation(self, elicitation_id: str, *, timeout: float) -> Elicitation:
        """Long-poll until the elicitation ends or ``timeout`` seconds pass; its last state."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            elicitation = self.get_elicitation(
                elicitation_id, wait=max(0, min(MAX_WAIT, math.ceil(remaining))))
            if elicitation.is_terminal or time.monotonic() >= deadline:
                return elicitation

    def list_elicitations(
        self, *, subject: Subject | None = None, status: ElicitationStatus | None = None,
        kind: ElicitationKind | None = None, cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Elicitation]:
        """One page of this client's elicitations, newest first."""
        answer = self._http.request("GET", _ELICITATIONS, params={
            **_subject_filter(subject), "status": status, "kind": kind, "cursor": cursor,
            "limit": limit})
        return Page([Elicitation.from_json(item) for item in answer.body["items"]],
                    answer.body["next_cursor"])

    def iter_elicitations(self, **filters: Any) -> Iterator[Elicitation]:
        """Every elicitation matching the filters of :meth:`list_elicitations`, page by page."""
        cursor: str | None = None
        while True:
            page = self.list_elicitations(cursor=cursor, **filters)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel_elicitation(self, elicitation_id: str) -> Elicitation:
        """Cancel an open elicitation; its link stops working. 409 if it has ended."""
        answer = self._http.request("POST", f"{_ELICITATIONS}/{_segment(elicitation_id)}/cancel",
                                    retry_unless_sent=True)
        return Elicitation.from_json(answer.body)

    # --- credentials ----------------------------------------------------------------

    def list_credentials(
        self, *, subject: Subject | None = None, type: str | None = None,
        include_revoked: bool = False, cursor: str | None = None, limit: int | None = None,
    ) -> Page[Credential]:
        """One page of this client's credentials (metadata only), newest first."""
        answer = self._http.request("GET", _CREDENTIALS, params={
            **_subject_filter(subject), "type": type,
            "status": "all" if include_revoked else None, "cursor": cursor, "limit": limit})
        return Page([Credential.from_json(item) for item in answer.body["items"]],
                    answer.body["next_cursor"])

    def find_credential(self, subject: Subject, credential_type: str, *,
                        elicitation_id: str | None = None) -> Credential | None:
        """The subject's newest active credential of this type (from that elicitation, if given)."""
        for credential in self._iter_credentials(subject=subject, type=credential_type):
            if elicitation_id is None or credential.elicitation_id == elicitation_id:
                return credential
        return None

    def _iter_credentials(self, **filters: Any) -> Iterator[Credential]:
        cursor: str | None = None
        while True:
            page = self.list_credentials(cursor=cursor, **filters)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def reveal_credential(self, credential_id: str) -> RevealedCredential:
        """The plaintext secret (audited on the gateway). Keep it in memory only.

        For an OAuth connection, a working access token: raises
        :class:`~gateway.client.errors.ReconnectRequired` when the provider
        refused to refresh it (the user must connect again) and
        :class:`~gateway.client.errors.ProviderUnavailable` when the provider
        did not answer (try again after ``retry_after``).
        """
        answer = self._http.request("POST", f"{_CREDENTIALS}/{_segment(credential_id)}/reveal")
        return RevealedCredential.from_json(answer.body)

    def revoke_credential(self, credential_id: str) -> Credential:
        """Revoke a credential; it can no longer be revealed."""
        answer = self._http.request("DELETE", f"{_CREDENTIALS}/{_segment(credential_id)}")
        return Credential.from_json(answer.body)


def _subject_filter(subject: Subject | None) -> dict[str, str | None]:
    if subject is None:
        return {}
    return {"subject_iss": subject.iss, "subject_sub": subject.sub}


def _segment(identifier: str) -> str:
    # Ids are URL-safe by construction; refuse anything that would change the path.
    if not identifier or not all(ch.isalnum() or ch in "_-" for ch in identifier):
        raise InvalidRequest(400, {"title": "Invalid id",
                                   "detail": f"{identifier!r} is not a gateway id"})
    return identifier
