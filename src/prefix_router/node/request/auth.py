"""Client API keys and the admin token: compared in constant time, never logged or echoed.

Keys are kept as SHA-256 digests. A presented key is hashed, looked up by digest (the attacker cannot steer
a digest's bytes, so lookup timing reveals nothing about valid keys) and confirmed with
``hmac.compare_digest``.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

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


class RevokedSessions:
    """Session ids signed out before their expiry (the dashboard's logout), each kept until it expires:
    a copied cookie is refused from then on. At most ``capacity`` ids: when full, the expired go first,
    then the one expiring soonest (a cookie that would have lapsed first). ``on_revoke`` is told of each
    id revoked here (``serve --processes``: the other processes revoke it too); ``apply`` takes one from
    elsewhere without telling. ``clock``: wall time, seconds (the ids' expiries are wall time)."""

    def __init__(self, capacity: int = 4096, clock: Callable[[], float] = time.time) -> None:
        self.capacity, self.clock = capacity, clock
        self._until: dict[str, int] = {}
        self.on_revoke: Callable[[str, int], None] | None = None

    def __len__(self) -> int:
        return len(self._until)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._until

    def items(self) -> Iterator[tuple[str, int]]:
        return iter(list(self._until.items()))

    def revoke(self, session_id: str, expiry: int) -> None:
        if self.apply(session_id, expiry) and self.on_revoke is not None:
            self.on_revoke(session_id, expiry)

    def apply(self, session_id: str, expiry: int) -> bool:
        """Keep ``session_id`` revoked until ``expiry``: False if it was already, or has expired."""
        now = self.clock()
        if expiry < now or session_id in self._until:
            return False
        if len(self._until) >= self.capacity:
            for gone in [s for s, until in self._until.items() if until < now]:
                del self._until[gone]
        if len(self._until) >= self.capacity:
            del self._until[min(self._until, key=self._until.__getitem__)]
        self._until[session_id] = expiry
        return True


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
