"""Who may see the dashboard: the admin token as a bearer header, or a session cookie from the login form.

The login form posts the token once (a POST body: never in a URL, so never in an access log or a
browser's history); the router answers with a cookie that holds no secret: a random id, its expiry and
an HMAC of both under a key derived from the admin token (``Credentials.keys``). Any process or replica
with the same token accepts it, and a new token voids every session. Signing out revokes its id until it
expires (``RevokedSessions``, bounded; ``serve --processes``: in every process, through the shared pool's
channel; not in other replicas), so a copied cookie is refused after the logout. The cookie is
``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends it),
``Path=/dashboard`` and ``Secure`` behind TLS. Failed sign-ins are limited per client address
(``LoginLimiter``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

from aiohttp import web

from prefix_router.node.request.auth import Credentials, RevokedSessions, bearer

COOKIE = "prefix_router_dashboard"
SESSION_S = 8 * 3600  # a login lasts a working day
_PURPOSE = b"prefix-router dashboard session v1"
LOGIN_FAILURES = 5  # failed sign-ins an address may make per window
LOGIN_WINDOW_S = 60.0
LOGIN_ADDRESSES = 4096  # addresses counted at once


def _mac(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def new_session(token: Credentials, now: Callable[[], float] = time.time) -> str:
    """A cookie value: ``id.expiry.mac`` (no secret in it)."""
    body = f"{secrets.token_hex(16)}.{int(now()) + SESSION_S}"
    return f"{body}.{_mac(token.keys(_PURPOSE)[0], body)}"


def session_of(
    token: Credentials, value: str | None, now: Callable[[], float] = time.time
) -> tuple[str, int] | None:
    """A genuine, unexpired cookie's (id, expiry); None for any other value."""
    if not value or len(value) > 128:
        return None
    body, _, mac = value.rpartition(".")
    ident, _, expiry = body.partition(".")
    if not expiry.isdigit() or int(expiry) < now():
        return None
    if not any(hmac.compare_digest(_mac(key, body), mac) for key in token.keys(_PURPOSE)):
        return None
    return ident, int(expiry)


def valid_session(
    token: Credentials,
    value: str | None,
    now: Callable[[], float] = time.time,
    revoked: RevokedSessions | None = None,
) -> bool:
    """Genuine, unexpired and not signed out."""
    found = session_of(token, value, now)
    return found is not None and (revoked is None or found[0] not in revoked)


def signed_in(token: Credentials, request: web.Request, revoked: RevokedSessions) -> bool:
    """The admin token as a bearer header, or a valid session cookie not signed out."""
    if token.accepts(bearer(request.headers)):
        return True
    return valid_session(token, request.cookies.get(COOKIE), revoked=revoked)


class LoginLimiter:
    """Failed sign-ins per client address: after ``failures`` within ``window_s`` of the first, that
    address is refused (429) until the window ends, right token or not; a sign-in that succeeds clears its
    count. At most ``capacity`` addresses are counted (the least recently seen go first: an attacker with
    that many addresses can age a count out, not guess faster from one). Per process: with
    ``serve --processes N`` an address may try up to N times as often (the kernel spreads connections)."""

    def __init__(
        self,
        capacity: int = LOGIN_ADDRESSES,
        failures: int = LOGIN_FAILURES,
        window_s: float = LOGIN_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity, self.failures, self.window_s, self.clock = capacity, failures, window_s, clock
        self._counts: OrderedDict[str, tuple[float, int]] = OrderedDict()  # address: (window start, count)

    def __len__(self) -> int:
        return len(self._counts)

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try again (0: now)."""
        found = self._counts.get(address)
        if found is None:
            return 0.0
        left = found[0] + self.window_s - self.clock()
        if left <= 0:
            del self._counts[address]
            return 0.0
        return left if found[1] >= self.failures else 0.0

    def failed(self, address: str) -> None:
        now = self.clock()
        start, count = self._counts.pop(address, (now, 0))
        if start + self.window_s <= now:
            start, count = now, 0
        self._counts[address] = (start, count + 1)
        while len(self._counts) > self.capacity:
            self._counts.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._counts.pop(address, None)


def set_cookie(response: web.StreamResponse, value: str, secure: bool) -> None:
    response.set_cookie(
        COOKIE, value, max_age=SESSION_S, path="/dashboard", httponly=True, samesite="Strict", secure=secure
    )


def clear_cookie(response: web.StreamResponse) -> None:
    response.del_cookie(COOKIE, path="/dashboard")
