"""Errors the router makes itself, always in the OpenAI error body shape."""

from __future__ import annotations

import orjson
from aiohttp import web

MAX_MESSAGE_CHARS = 512  # an error's message, which may quote client input (a model name), is cut there


class ProxyError(Exception):
    """An error answered to the client as ``{"error": {"message", "type", "param", "code"}}``; a message
    over ``MAX_MESSAGE_CHARS`` is cut short (ending in ``...``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
        close: bool = False,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:  # it may quote client input: bounded
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.close = close  # the connection closes after the answer (the request was not read whole)

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return orjson.dumps({"error": error})

    def response(self) -> web.Response:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        response = web.Response(
            status=self.status, body=self.body(), content_type="application/json", headers=headers
        )
        if self.close:
            response.force_close()
        return response


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ProxyError:
    return ProxyError(400, message, param=param, code=code)


def unavailable(message: str, retry_after: int) -> ProxyError:
    return ProxyError(
        503, message, type="service_unavailable", code="no_healthy_worker", retry_after=retry_after
    )


def shutting_down(retry_after: int) -> ProxyError:
    return ProxyError(
        503,
        "the router is shutting down",
        type="service_unavailable",
        code="shutting_down",
        retry_after=retry_after,
    )


def overloaded(message: str, retry_after: int) -> ProxyError:
    return ProxyError(
        429, message, type="rate_limit_error", code="too_many_requests", retry_after=retry_after
    )


def upstream_failed(message: str, timeout: bool) -> ProxyError:
    if timeout:
        return ProxyError(504, message, type="upstream_error", code="upstream_timeout")
    return ProxyError(502, message, type="upstream_error", code="upstream_unavailable")
