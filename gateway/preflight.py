"""What ``gateway serve`` checks before it starts, and ``gateway status`` reports.

The configuration names places the gateway will call: the identity
provider's issuer, each credential type's live check, each client's webhook
URL. Held against the outbound guard's own rules (:meth:`OutboundPolicy.check_url`,
no lookup), a refused one is found once, here, with the setting to change,
instead of being logged in passing at some user's login, key or webhook.
The identity provider, and each OAuth type's provider named by an issuer,
are also asked for their discovery documents, briefly.

What refuses to start and what only warns:

- the issuer refused by the guard refuses: nobody could log in, no retry
  makes it better, and the fix is a setting;
- a credential type whose check URL the guard refuses refuses too: no key of
  that type could be stored, and the catalog is validated at start anyway;
- an identity provider that does not answer, or answers wrongly, warns: it may
  be starting as well, and every login asks it again;
- an OAuth type's discovery document that the gateway will not work with
  (an endpoint that breaks the provider URL rule, no PKCE S256) refuses: no
  user could connect that type until the provider or the catalog changes;
  a provider that does not answer warns, as the identity provider does;
- a client's webhook URL the guard refuses warns: one client's registration
  must not stop the gateway for every other, and
  ``gateway clients set-webhook-url`` fixes it while the gateway runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import requests
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from gateway.clients.models import Client
from gateway.credentials.catalog import CatalogError, catalog_of, catalog_path
from gateway.db import for_reads
from gateway.identity import oidc
from gateway.oauth.provider import DiscoveryRefused, Provider, ProviderUnavailable
from gateway.outbound import BlockedDestination, OutboundPolicy
from gateway.settings import Settings, env_name

ISSUER_TIMEOUT_SECONDS: Final = 3.0
ISSUER: Final = env_name("oidc_issuer")
CATALOG_FILE: Final = env_name("credential_types_file")


@dataclass(frozen=True, slots=True)
class Problem:
    """A place the configuration names that the gateway cannot use; what to change."""

    setting: str
    problem: str
    refuses_start: bool

    def __str__(self) -> str:
        return f"{self.setting}: {self.problem}"

    def as_json(self) -> dict[str, Any]:
        return {"setting": self.setting, "problem": self.problem,
                "refuses_start": self.refuses_start}


def problems(settings: Settings, policy: OutboundPolicy, engine: Engine | None) -> list[Problem]:
    """Every problem below; the webhook URLs only with a database to read them from."""
    found = [*issuer_problems(settings, policy, reach=True), *catalog_problems(settings, policy),
             *oauth_problems(settings)]
    if engine is not None:
        found += webhook_problems(engine, policy)
    return found


def issuer_problems(settings: Settings, policy: OutboundPolicy, *,
                    reach: bool) -> list[Problem]:
    """The identity provider's issuer against the guard; with ``reach``, asked for its
    discovery document once, briefly."""
    if settings.login_backend != "oidc":
        return []
    provider = oidc.Provider(settings)
    url = provider.discovery_url
    try:
        policy.check_url(url)
        if reach:
            provider.probe(ISSUER_TIMEOUT_SECONDS)
    except BlockedDestination as error:  # also a name that resolves to a refused address
        return [Problem(ISSUER, f"the outbound guard refuses {error.destination} "
                        f"({error.reason}), so nobody can log in; use the identity provider's "
                        "https issuer", refuses_start=True)]
    except requests.HTTPError as error:
        status = error.response.status_code if error.response is not None else "an error"
        problem = f"the identity provider answered {url} with HTTP {status}"
    except requests.JSONDecodeError:
        problem = f"the identity provider answered {url} with something other than JSON"
    except requests.Timeout:
        problem = (f"the identity provider did not answer {url} within "
                   f"{ISSUER_TIMEOUT_SECONDS:g} s")
    except requests.RequestException as error:
        problem = f"the identity provider cannot be reached at {url} ({type(error).__name__})"
    except oidc.ProviderUnavailable as error:
        problem = error.detail
    else:
        return []
    return [Problem(ISSUER, f"{problem}; logins fail until that is fixed", refuses_start=False)]


def catalog_problems(settings: Settings, policy: OutboundPolicy) -> list[Problem]:
    """A catalog that does not load, or a live check URL in it that the guard refuses."""
    path = catalog_path(settings)
    try:
        catalog = catalog_of(settings)
    except CatalogError as error:
        return [Problem(CATALOG_FILE, str(error), refuses_start=True)]
    where = f"{path} ({CATALOG_FILE})" if settings.credential_types_file else str(path)
    found = []
    for credential_type in catalog:
        if credential_type.check is None:
            continue
        try:
            policy.check_url(credential_type.check.url)
        except BlockedDestination as error:
            found.append(Problem(
                f"[{credential_type.id}.check] url in {where}",
                f"the outbound guard refuses {error.destination} ({error.reason}), so no "
                f"{credential_type.label} can be checked, and none stored", refuses_start=True))
    return found


def oauth_problems(settings: Settings) -> list[Problem]:
    """Each OAuth type with an issuer: its discovery document, asked for once, briefly.

    A catalog that does not load is :func:`catalog_problems`' to report.
    """
    try:
        catalog = catalog_of(settings)
    except CatalogError:
        return []
    found = []
    for credential_type in catalog:
        if credential_type.oauth is None or credential_type.oauth.issuer is None:
            continue
        where = f"[{credential_type.id}.oauth] issuer"
        try:
            Provider(credential_type, settings).discover(ISSUER_TIMEOUT_SECONDS)
        except DiscoveryRefused as error:
            found.append(Problem(where, f"{error.detail}; fix the provider or the credential "
                                 "type", refuses_start=True))
        except ProviderUnavailable as error:
            found.append(Problem(where, f"{error.detail}; no {credential_type.label} can be "
                                 "connected until it answers", refuses_start=False))
    return found


def webhook_problems(engine: Engine, policy: OutboundPolicy) -> list[Problem]:
    """Active clients whose webhook URL the guard refuses: every delivery to them would fail."""
    found = []
    with Session(for_reads(engine)) as session:
        rows = session.execute(select(Client.id, Client.name, Client.webhook_url)
                               .where(Client.status == "active", Client.webhook_url.is_not(None))
                               .order_by(Client.created_at, Client.id))
        for client_id, name, url in rows:
            try:
                policy.check_url(url or "")  # never empty: the query takes those with a URL
            except BlockedDestination as error:
                found.append(Problem(
                    f"webhook URL of client {client_id} ({name})",
                    f"the outbound guard refuses {error.destination} ({error.reason}), so "
                    "every webhook to it fails; change it with `gateway clients "
                    f"set-webhook-url {client_id} URL`", refuses_start=False))
    return found
