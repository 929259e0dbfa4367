"""The client SDK against a served gateway, over real HTTPS."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import requests
from requests.adapters import HTTPAdapter

from gateway.client import (
    AuthenticationFailed,
    Conflict,
    GatewayClient,
    GatewayUnavailable,
    InvalidRequest,
    NotFound,
    ProblemError,
    ProviderUnavailable,
    ReconnectRequired,
    RevealedCredential,
    Subject,
    TemporarilyUnavailable,
)
from tests.client.conftest import OAUTH_SCOPES, OAUTH_TYPE, ServedGateway, User
from tests.integration.conftest import free_port

pytestmark = pytest.mark.slow

KEY = "wx-live-7f3a9c2e5b1d4a6f8e0c"


@pytest.fixture
def gateway(served: ServedGateway) -> GatewayClient:
    registered = served.register()
    return GatewayClient(served.origin, registered.api_token, verify=str(served.certfile))


def subject_of(served: ServedGateway, user: User) -> Subject:
    # The local login backend names its users (public origin, user name).
    return Subject(served.origin, user.username)


def test_create_reuse_get_list_and_cancel(gateway: GatewayClient, served: ServedGateway,
                                          user: User) -> None:
    subject = subject_of(served, user)
    first = gateway.request_api_key(subject, "generic", "Connect your weather key",
                                    metadata={"tool": "forecast"}, ttl_seconds=600)
    assert first.created
    assert first.status == "pending"
    assert first.url == f"{served.origin}/e/{first.id}"
    assert first.mcp == {"mode": "url", "message": "Connect your weather key",
                         "url": first.url, "elicitationId": first.id}
    assert first.metadata == {"tool": "forecast"}
    again = gateway.request_api_key(subject, "generic", "Connect your weather key")
    assert (again.id, again.created) == (first.id, False)
    other = gateway.request_api_key(subject, "generic", "Another", reuse_pending=False)
    assert other.created
    assert other.id != first.id

    assert gateway.get_elicitation(first.id).status == "pending"
    page = gateway.list_elicitations(subject=subject, limit=1)
    assert [e.id for e in page] == [other.id]
    assert page.next_cursor is not None
    assert [e.id for e in gateway.iter_elicitations(subject=subject)] == [other.id, first.id]

    cancelled = gateway.cancel_elicitation(first.id)
    assert cancelled.status == "cancelled"
    assert cancelled.is_terminal
    with pytest.raises(Conflict) as ended:
        gateway.cancel_elicitation(first.id)
    assert ended.value.status == 409
    assert [e.id for e in gateway.list_elicitations(status="cancelled")] == [first.id]


def test_long_poll_returns_when_the_user_finishes_and_the_key_is_revealed_once_asked(
    gateway: GatewayClient, served: ServedGateway, user: User,
) -> None:
    subject = subject_of(served, user)
    asked = gateway.request_api_key(subject, "generic", "Connect your weather key")
    user.enter_key_later(asked.url, KEY, delay=1.0)
    started = time.monotonic()
    done = gateway.get_elicitation(asked.id, wait=30)
    assert done.status == "completed"
    assert time.monotonic() - started < 15

    [credential] = gateway.list_credentials(subject=subject, type="generic")
    assert credential.elicitation_id == asked.id
    assert credential.hint == "…8e0c"
    assert gateway.find_credential(subject, "generic", elicitation_id=asked.id) == credential
    revealed = gateway.reveal_credential(credential.id)
    assert revealed.secret == KEY
    assert KEY not in repr(revealed)
    revoked = gateway.revoke_credential(credential.id)
    assert revoked.status == "revoked"
    assert gateway.find_credential(subject, "generic") is None
    assert len(gateway.list_credentials(subject=subject, include_revoked=True)) == 1
    with pytest.raises(ProblemError) as gone:
        gateway.reveal_credential(credential.id)
    assert gone.value.status in (404, 409)


def test_wait_for_elicitation_gives_up_after_its_timeout(
    gateway: GatewayClient, served: ServedGateway, user: User,
) -> None:
    asked = gateway.request_api_key(subject_of(served, user), "generic", "Connect")
    started = time.monotonic()
    still = gateway.wait_for_elicitation(asked.id, timeout=2)
    assert still.status == "pending"
    assert 1.5 < time.monotonic() - started < 10


def test_errors_carry_the_problem_details(gateway: GatewayClient,
                                          served: ServedGateway) -> None:
    with pytest.raises(NotFound) as missing:
        gateway.get_elicitation("el_nothinghere")
    problem = missing.value
    assert problem.status == 404
    assert problem.code == "not-found"
    assert problem.type == "urn:gateway:problem:not-found"
    assert problem.request_id
    assert problem.request_id in str(problem)

    with pytest.raises(InvalidRequest) as invalid:
        gateway.request_api_key(Subject("https://auth.example.com", "u"), "no-such-type", "x")
    assert invalid.value.status == 422
    assert "credential_type" in (invalid.value.detail or "")
    # In words for a person: the title, then the detail; no status, no request id.
    assert invalid.value.describe() == f"{invalid.value.title}: {invalid.value.detail}"

    stranger = GatewayClient(served.origin, "gw_" + "x" * 43, verify=str(served.certfile))
    with pytest.raises(AuthenticationFailed) as refused:
        stranger.list_elicitations()
    assert refused.value.status == 401
    assert "x" * 20 not in repr(stranger)


def test_plain_http_and_unsafe_ids_are_refused_before_anything_is_sent(
    gateway: GatewayClient,
) -> None:
    with pytest.raises(ValueError, match="https"):
        GatewayClient("http://localhost:8443", "gw_token")
    with pytest.raises(InvalidRequest):
        gateway.get_elicitation("../credentials")


def test_connection_errors_are_retried_then_reported() -> None:
    sleeps: list[float] = []
    port = free_port()  # nothing listens there
    client = GatewayClient(f"https://127.0.0.1:{port}", "gw_token", retries=2)
    client._http._sleep = sleeps.append  # type: ignore[attr-defined]
    with pytest.raises(GatewayUnavailable, match="3 attempt") as silent:
        client.list_elicitations()
    assert len(sleeps) == 2
    assert (silent.value.url, silent.value.reason) == (f"https://127.0.0.1:{port}",
                                                       "connection refused")
    assert silent.value.describe() == (f"The gateway at https://127.0.0.1:{port} did not "
                                       "answer: connection refused.")
    assert sleeps[1] > sleeps[0] / 3  # backing off, with jitter


class LosesFirstAnswer(HTTPAdapter):
    """Sends each request, but reports the first answer lost (a reset after the gateway acted)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[requests.PreparedRequest] = []

    def send(self, request: requests.PreparedRequest, *args: Any,
             **kwargs: Any) -> requests.Response:
        self.sent.append(request)
        response = super().send(request, *args, **kwargs)
        if len(self.sent) == 1:
            raise requests.ConnectionError("connection reset by peer")
        return response


def test_a_create_whose_answer_was_lost_is_retried_with_the_same_idempotency_key(
    served: ServedGateway, user: User,
) -> None:
    registered = served.register()
    adapter = LosesFirstAnswer()
    session = requests.Session()
    session.mount("https://", adapter)
    client = GatewayClient(served.origin, registered.api_token, verify=str(served.certfile),
                           session=session)
    client._http._sleep = lambda _: None  # type: ignore[attr-defined]
    subject = subject_of(served, user)
    made = client.request_api_key(subject, "generic", "Connect", reuse_pending=False)
    assert len(adapter.sent) == 2
    keys = {r.headers["Idempotency-Key"] for r in adapter.sent}
    assert len(keys) == 1
    # The gateway made one elicitation and replayed its answer to the retry.
    assert made.created
    assert [e.id for e in client.iter_elicitations(subject=subject)] == [made.id]


def test_a_cancel_is_not_repeated_once_it_may_have_reached_the_gateway(
    gateway: GatewayClient, served: ServedGateway, user: User,
) -> None:
    asked = gateway.request_api_key(subject_of(served, user), "generic", "Connect")
    adapter = LosesFirstAnswer()
    gateway._http._session.mount("https://", adapter)  # type: ignore[attr-defined]
    with pytest.raises(GatewayUnavailable, match="1 attempt"):
        gateway.cancel_elicitation(asked.id)
    assert len(adapter.sent) == 1
    assert gateway.get_elicitation(asked.id).status == "cancelled"


def test_a_long_poll_runs_beside_other_calls(gateway: GatewayClient, served: ServedGateway,
                                             user: User) -> None:
    subject = subject_of(served, user)
    asked = gateway.request_api_key(subject, "generic", "Connect")
    answers: list[str] = []
    poll = threading.Thread(target=lambda: answers.append(
        gateway.get_elicitation(asked.id, wait=20).status))
    poll.start()
    time.sleep(0.5)
    gateway.cancel_elicitation(asked.id)
    poll.join(timeout=15)
    assert answers == ["cancelled"]


# --- OAuth connections ----------------------------------------------------------------


class Recording(HTTPAdapter):
    """Sends each request on, keeping a copy."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[requests.PreparedRequest] = []

    def send(self, request: requests.PreparedRequest, *args: Any,
             **kwargs: Any) -> requests.Response:
        self.sent.append(request)
        return super().send(request, *args, **kwargs)


def test_request_oauth_asks_for_a_connection_with_its_scopes(
    gateway: GatewayClient, served: ServedGateway, user: User,
) -> None:
    subject = subject_of(served, user)
    recording = Recording()
    gateway._http._session.mount("https://", recording)  # type: ignore[attr-defined]
    asked = gateway.request_oauth(subject, OAUTH_TYPE, "Connect your Forge account",
                                  scopes=["read:user"], metadata={"tool": "repos"})
    [sent] = recording.sent
    assert json.loads(sent.body or b"") == {
        "subject": {"iss": served.origin, "sub": user.username}, "kind": "oauth",
        "credential_type": OAUTH_TYPE, "scopes": ["read:user"],
        "message": "Connect your Forge account", "metadata": {"tool": "repos"},
        "reuse_pending": True}
    assert sent.headers["Idempotency-Key"]
    assert asked.created
    assert (asked.kind, asked.credential_type, asked.scopes) == ("oauth", OAUTH_TYPE,
                                                                 ["read:user"])
    assert asked.url == f"{served.origin}/e/{asked.id}"

    # The same scopes reuse the open one; other scopes (left out: the type's own) do not.
    again = gateway.request_oauth(subject, OAUTH_TYPE, "Connect your Forge account",
                                  scopes=["read:user"])
    assert (again.id, again.created) == (asked.id, False)
    wider = gateway.request_oauth(subject, OAUTH_TYPE, "Connect your Forge account")
    assert wider.created
    assert wider.scopes == OAUTH_SCOPES
    assert [e.id for e in gateway.list_elicitations(subject=subject, kind="oauth")] == [
        wider.id, asked.id]


def test_request_oauth_refuses_what_the_type_does_not_offer(
    gateway: GatewayClient, served: ServedGateway, user: User,
) -> None:
    subject = subject_of(served, user)
    with pytest.raises(InvalidRequest) as key_type:
        gateway.request_oauth(subject, "generic", "Connect")
    assert "kind api_key" in (key_type.value.detail or "")
    with pytest.raises(InvalidRequest) as scope:
        gateway.request_oauth(subject, OAUTH_TYPE, "Connect", scopes=["admin:org"])
    assert "admin:org" in (scope.value.detail or "")
    with pytest.raises(TypeError, match="list"):
        gateway.request_oauth(subject, OAUTH_TYPE, "Connect", scopes="read:user")


def test_a_connection_is_listed_with_its_account_and_scopes(
    gateway: GatewayClient, served: ServedGateway, user: User,
) -> None:
    subject = subject_of(served, user)
    asked = gateway.request_oauth(subject, OAUTH_TYPE, "Connect", scopes=["read:user"])
    credential_id = served.connect_account(asked.id, "gho_" + "a" * 36, account="octocat")
    assert gateway.get_elicitation(asked.id).status == "completed"
    found = gateway.find_credential(subject, OAUTH_TYPE, elicitation_id=asked.id)
    assert found is not None
    assert (found.id, found.kind, found.account, found.scopes, found.hint) == (
        credential_id, "oauth", "octocat", ["read:user"], "octocat")
    revoked = gateway.revoke_credential(found.id)
    assert (revoked.status, revoked.revoked_reason) == ("revoked", "client")
    key = gateway.request_api_key(subject, "generic", "Connect your key")
    assert (key.kind, key.scopes) == ("api_key", None)


def test_revealing_a_connection_gives_its_access_token(
    gateway: GatewayClient, served: ServedGateway, user: User,
) -> None:
    subject = subject_of(served, user)
    asked = gateway.request_oauth(subject, OAUTH_TYPE, "Connect", scopes=["read:user"])
    token = "gho_" + "b" * 36
    credential_id = served.connect_account(asked.id, token, account="octocat")
    revealed = gateway.reveal_credential(credential_id)
    assert (revealed.id, revealed.type, revealed.secret) == (credential_id, OAUTH_TYPE, token)
    assert (revealed.token_type or "").lower() == "bearer"
    assert (revealed.scopes, revealed.account) == (["read:user"], "octocat")
    assert revealed.expires_at is not None
    assert revealed.expires_at.endswith("Z")
    assert token not in repr(revealed)


def test_a_connection_whose_refresh_was_refused_asks_for_reconnecting(
    gateway: GatewayClient, served: ServedGateway, user: User,
) -> None:
    subject = subject_of(served, user)
    asked = gateway.request_oauth(subject, OAUTH_TYPE, "Connect")
    credential_id = served.connect_account(asked.id, "gho_" + "e" * 36, account="octocat")
    served.refresh_refused(credential_id)
    with pytest.raises(ReconnectRequired) as refused:
        gateway.reveal_credential(credential_id)
    assert (refused.value.status, refused.value.code) == (409, "reconnect-required")
    [revoked] = gateway.list_credentials(subject=subject, include_revoked=True)
    assert (revoked.status, revoked.revoked_reason) == ("revoked", "refresh-failed")


def test_a_revealed_connection_carries_its_oauth_fields_and_a_key_none() -> None:
    connection = RevealedCredential.from_json({
        "id": "cr_1", "type": "forge", "secret": "gho_token", "token_type": "Bearer",
        "expires_at": "2027-01-01T00:00:00Z", "scopes": ["read:user"], "account": "octocat",
        "some_later_field": 1})
    assert (connection.token_type, connection.expires_at, connection.scopes,
            connection.account) == ("Bearer", "2027-01-01T00:00:00Z", ["read:user"], "octocat")
    assert "gho_token" not in repr(connection)
    key = RevealedCredential.from_json({"id": "cr_2", "type": "generic", "secret": KEY})
    assert (key.token_type, key.expires_at, key.scopes, key.account) == (None,) * 4


class Answers(requests.adapters.BaseAdapter):
    """Answers every request with one canned problem, sending nothing."""

    def __init__(self, status: int, code: str, headers: dict[str, str] | None = None) -> None:
        super().__init__()
        self.status, self.code, self.headers = status, code, headers or {}

    def send(self, request: requests.PreparedRequest, *args: Any,
             **kwargs: Any) -> requests.Response:
        response = requests.Response()
        response.status_code = self.status
        response.headers.update({"Content-Type": "application/problem+json", **self.headers})
        response._content = json.dumps({
            "type": f"urn:gateway:problem:{self.code}", "title": "Problem",
            "status": self.status, "detail": "canned"}).encode()
        response.request = request
        return response

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("status", "code", "raised", "not_raised"), [
    (409, "reconnect-required", ReconnectRequired, None),
    (409, "conflict", Conflict, ReconnectRequired),
    (503, "provider-unavailable", ProviderUnavailable, None),
    (503, "database-unavailable", TemporarilyUnavailable, ProviderUnavailable),
])
def test_a_reveal_refused_for_an_oauth_reason_raises_its_own_error(
    status: int, code: str, raised: type[ProblemError], not_raised: type[ProblemError] | None,
) -> None:
    session = requests.Session()
    session.mount("https://", Answers(status, code, {"Retry-After": "30"}))
    client = GatewayClient("https://gateway.test", "gw_token", session=session)
    with pytest.raises(raised) as refused:
        client.reveal_credential("cr_1")
    assert refused.value.code == code
    assert not_raised is None or not isinstance(refused.value, not_raised)
    if status == 503:
        assert refused.value.retry_after == 30
    # Subclasses, so a caller that handles 409 or 503 as a whole goes on working.
    assert isinstance(refused.value, Conflict if status == 409 else TemporarilyUnavailable)
