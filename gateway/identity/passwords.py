"""Argon2id for human passwords, and nowhere else.

Parameters are the OWASP minimum for Argon2id (19 MiB, 2 passes, 1 lane):
slow enough to make a stolen table expensive to crack, fast enough (tens of
milliseconds) for a login. A login with a hash made under other parameters
rehashes the password, so raising them upgrades users as they log in.
"""

from __future__ import annotations

from typing import Final

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

HASHER: Final = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1,
                               hash_len=32, salt_len=16, type=Type.ID)
MIN_LENGTH: Final = 12
MAX_LENGTH: Final = 1024
# Verified when the user does not exist, so a miss costs as long as a hit.
_DUMMY: Final = HASHER.hash("no such user; this only burns the same time")


class WeakPassword(ValueError):
    """A new password that breaks the rules; the message says which."""


def hash_password(password: str) -> str:
    """The Argon2id hash of a new password, after checking it is acceptable."""
    if len(password) < MIN_LENGTH:
        raise WeakPassword(f"a password needs at least {MIN_LENGTH} characters")
    if len(password) > MAX_LENGTH:
        raise WeakPassword(f"a password has at most {MAX_LENGTH} characters")
    return HASHER.hash(password)


def verify_password(stored_hash: str | None, password: str) -> bool:
    """Whether ``password`` matches; the same work is done when there is no hash."""
    try:
        return HASHER.verify(stored_hash or _DUMMY, password[:MAX_LENGTH]) and \
            stored_hash is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def needs_rehash(stored_hash: str) -> bool:
    """Whether the hash was made with other parameters than today's."""
    return HASHER.check_needs_rehash(stored_hash)
