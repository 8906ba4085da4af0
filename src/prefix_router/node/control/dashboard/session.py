"""Who may see the dashboard: the admin token as a bearer header, or a session cookie from the login form.

The login form posts the token once (a POST body: never in a URL, so never in an access log or a
browser's history); the router answers with a cookie that holds no secret: a random id, its expiry and
an HMAC of both under a key derived from the admin token (``Credentials.keys``). Any process or replica
with the same token accepts it, nothing is stored (so nothing grows), and a new token voids every
session. The cookie is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends
it), ``Path=/dashboard`` and ``Secure`` behind TLS.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

from aiohttp import web

from prefix_router.node.request.auth import Credentials, bearer

COOKIE = "prefix_router_dashboard"
SESSION_S = 8 * 3600  # a login lasts a working day
_PURPOSE = b"prefix-router dashboard session v1"


def _mac(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def new_session(token: Credentials, now: Callable[[], float] = time.time) -> str:
    """A cookie value: ``id.expiry.mac`` (no secret in it)."""
    body = f"{secrets.token_hex(16)}.{int(now()) + SESSION_S}"
    return f"{body}.{_mac(token.keys(_PURPOSE)[0], body)}"


def valid_session(token: Credentials, value: str | None, now: Callable[[], float] = time.time) -> bool:
    if not value or len(value) > 128:
        return False
    body, _, mac = value.rpartition(".")
    _, _, expiry = body.partition(".")
    if not expiry.isdigit() or int(expiry) < now():
        return False
    return any(hmac.compare_digest(_mac(key, body), mac) for key in token.keys(_PURPOSE))


def signed_in(token: Credentials, request: web.Request) -> bool:
    """The admin token as a bearer header, or a valid session cookie."""
    return token.accepts(bearer(request.headers)) or valid_session(token, request.cookies.get(COOKIE))


def set_cookie(response: web.StreamResponse, value: str, secure: bool) -> None:
    response.set_cookie(
        COOKIE, value, max_age=SESSION_S, path="/dashboard", httponly=True, samesite="Strict", secure=secure
    )


def clear_cookie(response: web.StreamResponse) -> None:
    response.del_cookie(COOKIE, path="/dashboard")
