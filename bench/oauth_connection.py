"""Store an OAuth connection for the `reveal-oauth` scenario, sealed as the callback seals one.

    python bench/oauth_connection.py CLIENT_ID SUBJECT_ISS SUBJECT_SUB

Run by the scenario's setup with the benchmarked gateway's environment (its
database and keyring); prints the new credential's id. No provider is asked:
the token response is made up, its access token valid for a year, so no
reveal of the scenario refreshes it. It is a process of its own because
bench/scenarios.py, which the bare app imports too, must not import the
gateway.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Final

from sqlalchemy.orm import sessionmaker

from gateway.clock import SystemClock
from gateway.credentials import service
from gateway.credentials.catalog import CredentialType, OAuthProvider
from gateway.db import make_engine
from gateway.elicitations.models import Elicitation
from gateway.oauth.tokens import seal_connection
from gateway.settings import load_settings
from gateway.tokens import new_id
from gateway.vault import versions

TYPE: Final = "example-oauth"
SCOPES: Final = ["read:user", "repo"]
ACCESS_TOKEN: Final = "bench-access-" + "a" * 40
ACCOUNT: Final = "bench-account"
# Never configured in the gateway's catalog: a type there is only needed to
# refresh or revoke at the provider, and the scenario does neither.
EXAMPLE: Final = CredentialType(TYPE, "Example account", oauth=OAuthProvider(
    client_id="bench", client_secret=None, issuer="https://auth.example.com"))


def store(client_id: str, subject_iss: str, subject_sub: str) -> str:
    """A completed OAuth elicitation and its connection, in one transaction; the credential id."""
    settings = load_settings()
    clock = SystemClock()
    engine = make_engine(settings.database_url)
    try:
        keyring = versions.for_command(settings, engine, clock, role="cli")
        # Read (and its version listed) before the transaction, which on SQLite
        # holds the one write lock when the token set is sealed.
        keyring.refresh()
        now = clock.now()
        answer = {"access_token": ACCESS_TOKEN, "token_type": "Bearer",
                  "refresh_token": "bench-refresh-" + "r" * 40,
                  "expires_in": int(timedelta(days=365).total_seconds()),
                  "scope": " ".join(SCOPES)}
        with sessionmaker(engine, expire_on_commit=False).begin() as session:
            elicitation = Elicitation(
                id=new_id("el_", 18), client_id=client_id, subject_iss=subject_iss,
                subject_sub=subject_sub, kind="oauth", credential_type=TYPE, scopes=SCOPES,
                message="Connect your Example account", metadata_={}, status="opened",
                created_at=now, expires_at=now + timedelta(minutes=15), opened_at=now,
                ended_at=None)
            session.add(elicitation)
            session.flush()
            credential = seal_connection(keyring, elicitation, EXAMPLE, answer, scopes=SCOPES,
                                         account=ACCOUNT, now=now)
            service.capture(session, clock, elicitation, credential, actor="bench",
                            source_ip=None)
        return credential.id
    finally:
        engine.dispose()


if __name__ == "__main__":
    print(store(*sys.argv[1:4]))
