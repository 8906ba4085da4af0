"""The dashboard under ``/dashboard``, served by every carrier of the node (``serve`` and ``epp``) with the
admin API, behind the same admin token (off, 404, without one).

- ``GET /dashboard``: the page; without the token (bearer header or session cookie) a 401 with the login
  form. ``POST /dashboard/login`` (form field ``token``) sets the session cookie (``session.py``); an
  address that failed ``LOGIN_FAILURES`` times in ``LOGIN_WINDOW_S`` is answered 429 until the window
  ends (``LoginLimiter``). ``POST /dashboard/logout`` clears the cookie and revokes its session.
- ``GET /dashboard/data``: the page's document (``board.py``), polled by the page every second.
- ``GET /dashboard/static/{name}``: its script and style sheet, shipped in the package (nothing is fetched
  from elsewhere: the page's Content-Security-Policy allows this origin only).

Nothing runs while nobody watches: the document is made when asked (``Board``).
"""

from __future__ import annotations

import logging
import math
from importlib import resources

import orjson
from aiohttp import web

from prefix_router.node.control.dashboard.board import (
    BUCKET_S,
    DECISIONS_SHOWN,
    HOME_REQUESTS,
    MOVES_KEPT,
    PREFIXES_SHOWN,
    WINDOW_S,
    Board,
    home_of,
)
from prefix_router.node.control.dashboard.session import (
    COOKIE,
    LOGIN_ADDRESSES,
    LOGIN_FAILURES,
    LOGIN_WINDOW_S,
    LoginLimiter,
    clear_cookie,
    new_session,
    session_of,
    set_cookie,
    signed_in,
)
from prefix_router.node.request.errors import ProxyError
from prefix_router.node.state import STATE
from prefix_router.node.telemetry.audit import audit

__all__ = [
    "BUCKET_S",
    "CSP",
    "DECISIONS_SHOWN",
    "HOME_REQUESTS",
    "LOGIN_ADDRESSES",
    "LOGIN_FAILURES",
    "LOGIN_WINDOW_S",
    "MOVES_KEPT",
    "PREFIXES_SHOWN",
    "STATIC",
    "WINDOW_S",
    "Board",
    "LoginLimiter",
    "add_routes",
    "asset",
    "home_of",
    "page_response",
]

MAX_LOGIN_BODY = 4096
STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
BOARD = web.AppKey("prefix_router_dashboard", Board)
LIMITER = web.AppKey("prefix_router_dashboard_logins", LoginLimiter)


def asset(name: str) -> bytes:
    """A file of the dashboard as shipped in the package (``static/``)."""
    return resources.files(__package__).joinpath("static", name).read_bytes()


def page_response(name: str, status: int = 200, note: str = "") -> web.Response:
    body = asset(name).replace(b"{{note}}", note.encode())
    return web.Response(body=body, status=status, content_type="text/html", headers=_headers())


def _headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": CSP,
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }


def _allowed(request: web.Request) -> bool:
    """Signed in (401 otherwise); 404 while the admin API is off."""
    token = request.app[STATE].admin_token
    if not token:
        raise ProxyError(404, "the admin API is off (no admin token configured)", code="not_found")
    if signed_in(token, request, request.app[STATE].revoked):
        return True
    audit("admin_refused", logging.WARNING, method=request.method, path=request.path, remote=request.remote)
    return False


async def page(request: web.Request) -> web.StreamResponse:
    try:
        if not _allowed(request):
            return page_response("login.html", 401)
    except ProxyError as err:
        return err.response()
    return page_response("index.html")


async def data(request: web.Request) -> web.StreamResponse:
    try:
        if not _allowed(request):
            raise ProxyError(
                401, "admin token required", type="authentication_error", code="invalid_admin_token"
            )
    except ProxyError as err:
        return err.response()
    state = request.app[STATE]
    body = request.app[BOARD].cached(state.clock(), orjson.dumps)
    return web.Response(body=body, content_type="application/json", headers=_headers())


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    try:
        if not _allowed(request):
            raise ProxyError(
                401, "admin token required", type="authentication_error", code="invalid_admin_token"
            )
    except ProxyError as err:
        return err.response()
    if name not in STATIC:
        return ProxyError(404, "no such file", code="not_found").response()
    return web.Response(body=asset(name), content_type=STATIC[name], headers=_headers())


async def login(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if not state.admin_token:
        return ProxyError(
            404, "the admin API is off (no admin token configured)", code="not_found"
        ).response()
    limiter, address = request.app[LIMITER], request.remote or "-"
    wait_s = limiter.retry_after(address)
    if wait_s > 0:
        audit("dashboard_login_limited", logging.WARNING, remote=request.remote, retry_after_s=round(wait_s))
        note = f"Too many failed sign-ins from this address: try again in {math.ceil(wait_s)} s."
        response = page_response("login.html", 429, note)
        response.headers["Retry-After"] = str(math.ceil(wait_s))
        return response
    too_big = request.content_length is None or request.content_length > MAX_LOGIN_BODY
    form = {} if too_big else await request.post()
    token = form.get("token")
    if not isinstance(token, str) or not state.admin_token.accepts(token):
        limiter.failed(address)
        audit("admin_refused", logging.WARNING, method=request.method, path=request.path,
              remote=request.remote)  # fmt: skip
        return page_response("login.html", 401, "That is not the admin token.")
    limiter.succeeded(address)
    audit("dashboard_login", remote=request.remote)
    response = web.Response(status=303, headers={**_headers(), "Location": "/dashboard"})
    set_cookie(response, new_session(state.admin_token), secure=request.secure)
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    """Clears the cookie and revokes its session (a copy of it is refused from now on)."""
    state = request.app[STATE]
    found = session_of(state.admin_token, request.cookies.get(COOKIE)) if state.admin_token else None
    if found is not None:
        state.revoked.revoke(*found)
        audit("dashboard_logout", remote=request.remote)
    response = page_response("login.html", 200, "Signed out.")
    clear_cookie(response)
    return response


def add_routes(app: web.Application) -> None:
    app[BOARD] = Board(app[STATE])
    app[LIMITER] = LoginLimiter()
    app.router.add_get("/dashboard", page)
    app.router.add_get("/dashboard/data", data)
    app.router.add_get("/dashboard/static/{name}", static)
    app.router.add_post("/dashboard/login", login)
    app.router.add_post("/dashboard/logout", logout)
