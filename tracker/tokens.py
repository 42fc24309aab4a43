"""API token format `rc_<prefix>_<secret>`: the prefix finds the row, the hash proves the secret."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

TOKEN_PREFIX = "rc"  # noqa: S105 - a public marker, not a secret
PREFIX_BYTES = 6  # 12 hex chars: unique lookup key, not secret
SECRET_BYTES = 32
_HEX = "0123456789abcdef"


@dataclass(frozen=True)
class TokenParts:
    prefix: str
    secret: str


def generate() -> tuple[str, str, str]:
    """Return (full token to show once, prefix, hash to store)."""
    prefix = secrets.token_hex(PREFIX_BYTES)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    token = f"{TOKEN_PREFIX}_{prefix}_{secret}"
    return token, prefix, hash_secret(secret)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse(token: str) -> TokenParts | None:
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[1] or not parts[2]:
        return None
    # The prefix is looked up in the database: only what generate() makes gets that far (a NUL
    # would make PostgreSQL refuse the query, a 500 instead of a 401).
    if len(parts[1]) != 2 * PREFIX_BYTES or parts[1].strip(_HEX):
        return None
    return TokenParts(prefix=parts[1], secret=parts[2])


def matches(secret: str, hashed: str) -> bool:
    # Constant-time so response timing says nothing about how much of a guess was right.
    return hmac.compare_digest(hash_secret(secret), hashed)
