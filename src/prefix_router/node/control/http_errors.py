"""Answers to requests the router cannot parse or route, in the OpenAI error shape like every other error.

- HTTP parse errors (a control byte in a header, a header or URL over its limit, too many headers, bad
  framing) never reach the application: aiohttp's ``RequestHandler.handle_error`` answers them, and by
  default logs a traceback whose message quotes the offending bytes (a bearer token, say) and echoes them in
  a ``text/plain`` body. ``OpenAIRequestHandler`` answers 414 (request target over ``MAX_URL_BYTES``),
  431 (a header line over ``MAX_HEADER_BYTES``, or more than ``MAX_HEADERS`` headers), 505 (an HTTP
  version it cannot parse) or 400, with a fixed message, and logs one line naming the error class, never a
  byte of the request. A request line that parses but is not HTTP/1.x (``HTTP/2.0``, ``HTTP/0.9``) gets
  505 too, and the connection closes: the router speaks HTTP/1.0 and 1.1 only.
- ``Expect``: ``100-continue`` is answered once the request passed the checks that would refuse it
  (credentials or the admin token, declared size): the handler sends it when it reads the body
  (``parse.send_continue``, also in the admin API's ``read_json``), so a refused client never uploads its
  body. Any other value: 417 in the OpenAI shape, without quoting the value (``add_catch_all`` sets this on
  every route).
- Unknown paths and wrong methods: ``not_routed``, a catch-all route registered last (``CATCH_ALL``, any
  path, newlines included: ``/health%0a`` decodes to one), answers 404, or 405 with ``Allow`` when the
  path exists under other methods.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import BadStatusLine, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from prefix_router.node.request.errors import ProxyError

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# aiohttp checks the request target against max_line_size and each header line against max_field_size;
# the two limits differ so that an over-long line says which it was (414 or 431)
MAX_URL_BYTES = 16 * 1024
MAX_HEADER_BYTES = 8190
MAX_HEADERS = 128
HANDLER_LIMITS: dict[str, Any] = {
    "max_line_size": MAX_URL_BYTES,
    "max_field_size": MAX_HEADER_BYTES,
    "max_headers": MAX_HEADERS,
}


def parse_error(exc: BaseException | None) -> ProxyError:
    """The answer to a request aiohttp's parser refused, without a byte of the request in it."""
    if isinstance(exc, LineTooLong) and len(exc.args) > 1 and str(exc.args[1]) == str(MAX_URL_BYTES):
        return ProxyError(414, f"request target over {MAX_URL_BYTES} bytes", code="uri_too_long")
    if isinstance(exc, LineTooLong):
        return ProxyError(431, f"a header line over {MAX_HEADER_BYTES} bytes", code="header_too_large")
    if isinstance(exc, HttpProcessingError) and exc.message == "Too many headers received":
        return ProxyError(431, f"more than {MAX_HEADERS} headers", code="header_too_large")
    if isinstance(exc, BadStatusLine) and "Invalid HTTP version" in str(exc.message):
        return unsupported_version()
    name = type(exc).__name__ if exc is not None else "unknown"
    return ProxyError(400, f"malformed HTTP request ({name})", code="bad_http_request")


def unsupported_version() -> ProxyError:
    message = "HTTP version not supported (HTTP/1.0 and HTTP/1.1 are)"
    return ProxyError(505, message, code="http_version_not_supported", close=True)


async def refuse_version(request: web.BaseRequest) -> web.StreamResponse:
    return unsupported_version().response()


class OpenAIRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering errors outside the application in the OpenAI error shape,
    and a request of another HTTP version than 1.x with 505 instead of serving it."""

    __slots__ = ()

    async def _handle_request(
        self,
        request: BaseRequest,
        start_time: float | None,
        request_handler: Callable[[BaseRequest], Awaitable[web.StreamResponse]],
    ) -> tuple[web.StreamResponse, bool]:
        if request.version.major != 1:
            request_handler = refuse_version
            # answered in HTTP/1.1: aiohttp writes the request's version (``version`` reads its cache)
            request._cache["version"] = HttpVersion11
        return await super()._handle_request(request, start_time, request_handler)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        if status == 400 and isinstance(exc, HttpProcessingError):
            err = parse_error(exc)
            name = type(exc).__name__
            log.info("refused a malformed request from %s: %d %s", request.remote, err.status, name)
        else:  # a bug of the router's, not the client's input: logged with its traceback
            self.log_exception("error handling a request from %s", request.remote, exc_info=exc)
            err = ProxyError(500, "internal router error", type="server_error", code="internal_error")
        response = err.response()
        response.force_close()
        return response


class Connections(Protocol):
    """Another connection handler's connections (``proxy.run.lean``): made, and closed at shutdown."""

    def __call__(self) -> asyncio.Protocol: ...

    def pre_shutdown(self) -> None: ...

    async def shutdown(self, timeout: float | None) -> None: ...


class OpenAIServer(web.Server):
    """``web.Server`` whose connections are handled by ``OpenAIRequestHandler``, or first by ``lean``
    when set (which hands connections to ``handler``'s)."""

    lean: Connections | None = None

    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]  # any connection handler
        return self.handler() if self.lean is None else self.lean()

    def handler(self) -> RequestHandler:
        return OpenAIRequestHandler(self, loop=self._loop, **self._kwargs)

    def pre_shutdown(self) -> None:
        if self.lean is not None:
            self.lean.pre_shutdown()
        super().pre_shutdown()

    async def shutdown(self, timeout: float | None = None) -> None:
        if self.lean is not None:
            await self.lean.shutdown(timeout)
        await super().shutdown(timeout)


CATCH_ALL = "not_routed"
# what a route's {tail} takes: anything, newlines included (a pattern of "." stops at a decoded %0A)
ANY_PATH = r"[\s\S]"


async def not_routed(request: web.Request) -> web.StreamResponse:
    """404 for an unknown path, 405 (with ``Allow``) for a known path under another method."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource.name != CATCH_ALL:
            allowed |= (await resource.resolve(request))[1]
    if not allowed:
        return ProxyError(404, "unknown path (the API is under /v1/)", code="not_found").response()
    return method_not_allowed(request.method, ", ".join(sorted(allowed)))


def method_not_allowed(method: str, allowed: str) -> web.Response:
    response = ProxyError(405, f"method {method} not allowed here", code="method_not_allowed").response()
    response.headers["Allow"] = allowed
    return response


def add_catch_all(app: web.Application, handler: Handler) -> None:
    """Register ``handler`` (``not_routed``, or a wrapper of it) for every path and method, and the
    router's ``Expect`` handling on every route: call after every other route."""
    app.router.add_route("*", "/{tail:" + ANY_PATH + "*}", handler, name=CATCH_ALL)
    for route in app.router.routes():
        # aiohttp has no setter: the attribute its ``handle_expect_header`` calls
        route._expect_handler = expect_deferred


def unmet_expectation(request: web.BaseRequest) -> web.Response | None:
    """417 for an ``Expect`` other than ``100-continue`` (the connection closes after it); None for that."""
    if request.headers.get(hdrs.EXPECT, "").lower() == "100-continue":
        return None
    err = ProxyError(417, "unsupported Expect header (only 100-continue is)", code="expectation_failed")
    err.close = True
    return err.response()


async def expect_deferred(request: web.Request) -> web.StreamResponse | None:
    """``Expect`` on a route whose handler sends ``100 Continue`` when it reads the body."""
    return unmet_expectation(request) if request.version == HttpVersion11 else None
