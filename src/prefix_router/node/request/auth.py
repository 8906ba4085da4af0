"""Client API keys and the admin token: compared in constant time, never logged or echoed.

Keys are kept as SHA-256 digests. A presented key is hashed, looked up by digest (the attacker cannot steer
a digest's bytes, so lookup timing reveals nothing about valid keys) and confirmed with
``hmac.compare_digest``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

from pydantic import SecretStr

from prefix_router.node.request.errors import ProxyError


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header."""
    value = headers.get("Authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class Credentials:
    """A set of secrets checked in constant time. Empty: every request is accepted."""

    def __init__(self, secrets: Iterable[SecretStr]) -> None:
        self._digests = {d: d for d in (digest(s.get_secret_value()) for s in secrets)}

    def __bool__(self) -> bool:
        return bool(self._digests)

    def keys(self, purpose: bytes) -> list[bytes]:
        """A key per secret for ``purpose`` (HMAC keys derived from the digests: the dashboard's session
        cookies are signed with them, so that they never hold a secret and every replica sharing the
        secret accepts them)."""
        return [hmac.new(d, purpose, hashlib.sha256).digest() for d in self._digests]

    def accepts(self, token: str | None) -> bool:
        presented = digest(token or "")
        stored = self._digests.get(presented, b"\0" * 32)
        return hmac.compare_digest(presented, stored) and token is not None


def check_client(credentials: Credentials, headers: Mapping[str, str]) -> None:
    """401 unless client credentials are off (no API key configured) or the request carries a valid one."""
    if credentials and not credentials.accepts(bearer(headers)):
        raise ProxyError(
            401,
            "invalid or missing API key (Authorization: Bearer <key>)",
            type="invalid_request_error",
            code="invalid_api_key",
        )


def check_admin(token: Credentials, headers: Mapping[str, str]) -> None:
    """404 when the admin API is off (no token configured), 401 without the right bearer token."""
    if not token:
        raise ProxyError(404, "the admin API is off (no admin token configured)", code="not_found")
    if not token.accepts(bearer(headers)):
        raise ProxyError(401, "admin token required", type="authentication_error", code="invalid_admin_token")


def tenant_of(headers: Mapping[str, str]) -> str | None:
    """A stable, non-secret tenant id derived from the client's bearer token."""
    token = bearer(headers)
    return digest(token).hex()[:32] if token else None


def tenant_salt(headers: Mapping[str, str]) -> str | None:
    """The ``cache_salt`` the router gives the client's engine requests: derived from its bearer token
    (stable across router replicas and restarts), unrelated to its tenant id, revealing nothing of it."""
    token = bearer(headers)
    return digest("prefix-router cache_salt\0" + token).hex()[:32] if token else None
