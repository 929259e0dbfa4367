"""Asking the issuing service whether a key works, before it is stored.

The call goes through the SSRF-guarded client, the key travels only in the
header the catalog names, and nothing about the key reaches a log or the
user's page: only which of three answers came back.
"""

from __future__ import annotations

import logging
from enum import Enum

import requests

from gateway.credentials.catalog import KEY_PLACEHOLDER, LiveCheck
from gateway.errors import GatewayError
from gateway.outbound import BlockedDestination, OutboundPolicy, guarded_session

log = logging.getLogger(__name__)


class Verdict(Enum):
    VALID = "valid"
    INVALID = "invalid"
    UNAVAILABLE = "unavailable"


class KeyRejected(GatewayError):
    status = 422
    code = "key-rejected"
    title = "The service did not accept this key"


class CheckUnavailable(GatewayError):
    status = 503
    code = "key-check-unavailable"
    title = "The key could not be checked"


def ask(policy: OutboundPolicy, check: LiveCheck, secret: str) -> Verdict:
    """Call the check endpoint with the key; what its answer means."""
    headers = dict(check.headers)
    headers[check.header] = check.value.replace(KEY_PLACEHOLDER, secret)
    try:
        with guarded_session(policy) as session:
            response = session.request(check.method, check.url, headers=headers,
                                       timeout=(check.timeout_seconds, check.timeout_seconds))
            status = response.status_code
            response.close()
    except BlockedDestination as error:
        log.error("key check refused by the outbound guard: %s", error)
        return Verdict.UNAVAILABLE
    except requests.RequestException as error:
        # The exception's text could hold request details; its type is enough.
        log.warning("key check to %s failed: %s", check.url, type(error).__name__)
        return Verdict.UNAVAILABLE
    if status in check.valid_status:
        return Verdict.VALID
    if status in check.invalid_status:
        return Verdict.INVALID
    log.warning("key check to %s answered %d", check.url, status)
    return Verdict.UNAVAILABLE


def require_valid(policy: OutboundPolicy, check: LiveCheck, label: str, secret: str) -> None:
    """Raise a plain-words error unless the service accepts the key."""
    verdict = ask(policy, check, secret)
    if verdict is Verdict.INVALID:
        raise KeyRejected(f"The service says this {label} does not work. Check that you "
                          "copied the whole key, or create a new one, and try again.")
    if verdict is Verdict.UNAVAILABLE:
        raise CheckUnavailable(f"We could not check this {label} with its service just now. "
                               "Nothing was saved; try again in a moment.")
