"""What the portal shows of a connection: the connect page and the connected page.

Rendered for views that have already run the subject check. Only the connect
page opens the CSP's ``form-action`` to the provider's origin, because the
browser applies ``form-action`` to the redirect that follows the form.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from flask import render_template

from gateway.credentials.catalog import CredentialType, current_catalog, origin_of
from gateway.credentials.models import Credential
from gateway.credentials.service import missing_scopes
from gateway.elicitations.models import Elicitation
from gateway.errors import GatewayError
from gateway.oauth.provider import ProviderUnavailable, provider_for
from gateway.web.context import client_name
from gateway.web.headers import csp_allow_here


def connection_type(elicitation: Elicitation) -> CredentialType:
    """The OAuth type an elicitation asks to connect; a plain-words error when there is none."""
    if elicitation.kind != "oauth":
        raise GatewayError("This request is not for connecting an account. Reload the page.")
    credential_type = current_catalog().get(elicitation.credential_type or "")
    if credential_type is None or credential_type.oauth is None:
        raise GatewayError("This kind of account can no longer be connected here. Go back to "
                           "the app.")
    return credential_type


def connect_page(context: dict[str, Any], credential_type: CredentialType) -> str:
    """The connection request: which app, which provider, which permissions, one button.

    ``context`` is the elicitation page's (elicitation, client_name, subject,
    expiry, and the error to show, if any).
    """
    elicitation: Elicitation = context["elicitation"]
    assert credential_type.oauth is not None
    host, error = credential_type.oauth.host, context.get("error")
    try:
        authorization: str | None = provider_for(credential_type).endpoints().authorization
    except ProviderUnavailable as unavailable:
        authorization, error = None, error or unavailable.detail
    if authorization is not None:
        # The source is rebuilt from the parsed scheme, host and port: no
        # character of the provider's choosing reaches the policy.
        origin = origin_of(authorization)
        host = urlsplit(origin).netloc
        csp_allow_here("form-action", origin)
    return render_template("elicitation_oauth.html",
                           **{**context, "error": error, "provider_host": host,
                              "asked": f"access to your {credential_type.label}",
                              "credential_type": credential_type,
                              "scopes": elicitation.scopes or [],
                              "can_connect": authorization is not None})


def connected_page(elicitation: Elicitation, credential_type: CredentialType | None,
                   credential: Credential) -> str:
    """Done: which account was connected, and any permission the provider did not grant."""
    return render_template(
        "oauth_connected.html", client_name=client_name(elicitation.client_id),
        label=credential_type.label if credential_type else credential.type,
        account=credential.account, scopes=credential.scopes or [],
        missing=missing_scopes(elicitation.scopes, credential.scopes or []))
