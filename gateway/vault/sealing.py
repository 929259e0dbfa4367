"""Storing a sealed secret when its key version may be retired before the store commits.

A secret is sealed under the current key version before the transaction that
stores it, sometimes seconds before (a key is checked live, a provider
answers). Meanwhile an operator may rotate, rewrap and retire that version.
The database refuses the store then (the row's ``key_version`` refers to
``key_versions``, see :mod:`gateway.vault.models`), and the secret is sealed
again under the current version and stored again: here, for every caller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, TypeVar

from sqlalchemy.exc import IntegrityError

from gateway.vault.keyring import KeySource

log = logging.getLogger(__name__)

# Each further attempt means another version was retired in between: one
# more than a rotation's worth is plenty.
ATTEMPTS: Final = 3
# The foreign keys of the sealed tables, as the naming convention names them.
KEY_VERSION_FOREIGN_KEYS: Final = frozenset({
    "fk_credentials_key_version_key_versions",
    "fk_webhook_secrets_key_version_key_versions",
})

T = TypeVar("T")


def refers_to_missing_version(error: IntegrityError) -> bool:
    """Whether the database refused a sealed row because its key version is gone."""
    diagnostics = getattr(error.orig, "diag", None)  # PostgreSQL names the constraint
    if diagnostics is not None:
        return diagnostics.constraint_name in KEY_VERSION_FOREIGN_KEYS
    # SQLite names no constraint; a sealed row's other references (its
    # client, its elicitation) were read in the same transaction.
    return "FOREIGN KEY constraint failed" in str(error.orig)


def store_sealed(keyring: KeySource, store: Callable[[], T], *,
                 seal_again: Callable[[], None] | None = None) -> T:
    """Run ``store`` (a whole transaction); again, sealed anew, if its key version was retired.

    ``seal_again`` seals the secret again under the current version; without
    it, ``store`` seals inside, and runs again as it is.
    """
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return store()
        except IntegrityError as error:
            if attempt == ATTEMPTS or not refers_to_missing_version(error):
                raise
        log.info("a secret's key version was retired before it was stored; "
                 "sealing it again under the current version")
        keyring.refresh()
        if seal_again is not None:
            seal_again()
    raise AssertionError("unreachable: the last attempt returns or raises")
