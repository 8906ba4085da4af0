"""The network seam: one ``Upstream.send`` between the proxy and the engines.

Tests replace it with an in-memory fake; production uses ``AiohttpUpstream`` (the default) or the lean
``H1Upstream`` (``upstream_client: h1``). Responses are read chunk by
chunk with ``next_chunk`` (``b""`` at the end) and either ``release``-d (fully read) or ``abort``-ed
(the connection is closed, so the engine sees the disconnect and stops generating).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import aiohttp

from prefix_router.pool.http import client_session


class FailureKind(StrEnum):
    """Why an attempt on a worker failed: the ``kind`` label of ``prefix_router_upstream_errors_total``."""

    CONNECT = "connect"  # no connection: nothing was sent
    TIMEOUT = "timeout"
    IO = "io"  # the connection broke, or what came back is not HTTP
    STATUS = "status"  # the worker answered 5xx


UNENCODABLE = "the request could not be encoded for this worker"  # a header with CR, LF or NUL


class UpstreamError(Exception):
    """The exchange with the worker failed. ``kind``: connect (nothing was sent), timeout or io."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes


class UpstreamResponse(Protocol):
    status: int
    headers: Mapping[str, str]

    async def next_chunk(self) -> bytes:
        """The next piece of body as it arrives; ``b""`` at the end. Raises ``UpstreamError``."""
        ...

    def release(self) -> None: ...

    def abort(self) -> None: ...


class Upstream(Protocol):
    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Send the request and return once the status line and headers arrived."""
        ...


class _AiohttpResponse:
    __slots__ = ("_closed", "_on_close", "_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers
        self._on_close = _body_failer(resp.content)
        self._closed = _connection_closed(resp)
        if self._closed is not None:
            self._closed.add_done_callback(self._on_close)

    async def next_chunk(self) -> bytes:
        try:
            return await self._resp.content.readany()
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(FailureKind.IO, describe(exc)) from None

    def release(self) -> None:
        self._unwatch()
        self._resp.release()

    def abort(self) -> None:
        self._unwatch()
        self._resp.close()

    def _unwatch(self) -> None:
        if self._closed is not None:
            self._closed.remove_done_callback(self._on_close)
            self._closed = None


def _connection_closed(resp: aiohttp.ClientResponse) -> asyncio.Future[None] | None:
    """A future done when the response's connection closes (None once the body is all in). Asking for it
    makes aiohttp create it, so its outcome is always retrieved (one callback per connection)."""
    connection = resp.connection
    protocol = connection.protocol if connection is not None else None
    closed = protocol.closed if protocol is not None else None
    if closed is not None:
        closed.remove_done_callback(_retrieve)
        closed.add_done_callback(_retrieve)
    return closed


def _retrieve(closed: asyncio.Future[None]) -> None:
    if not closed.cancelled():
        closed.exception()  # a connection lost with an error: known (the reader sees it), not a leak


def _body_failer(content: aiohttp.StreamReader) -> Callable[[asyncio.Future[None]], None]:
    """Fails a body still unfinished when its connection closes. aiohttp 3.14's C parser leaves a body
    whose chunked framing breaks mid-way neither ended nor failed, so reading it would wait forever
    (tests/reliability/test_bad_engines.py, mode ``sse_then_garbage``)."""

    def fail(_: asyncio.Future[None]) -> None:
        if not content.is_eof() and content.exception() is None:
            content.set_exception(aiohttp.ClientPayloadError("upstream connection closed mid-body"))

    return fail


class AiohttpUpstream:
    """``Upstream`` over a pooled aiohttp client session (keep-alive; no decompression, no redirects)."""

    def __init__(self, connect_timeout_s: float, max_connections: int = 0) -> None:
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s
        )
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = client_session(self._timeout, connections=self._max_connections, decompress=False)
        return self._session

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        try:
            resp = await self._client().request(
                request.method,
                request.url,
                data=request.body or None,
                headers=request.headers,
                allow_redirects=False,
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise UpstreamError(FailureKind.CONNECT, describe(exc)) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(FailureKind.IO, describe(exc)) from None
        except ValueError:  # refused before sending (a header with a control character): this worker's
            # problem (its configured credential), so a failure to retry elsewhere; the text is not kept
            raise UpstreamError(
                FailureKind.CONNECT, "the request could not be encoded for this worker"
            ) from None
        return _AiohttpResponse(resp)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:300]
