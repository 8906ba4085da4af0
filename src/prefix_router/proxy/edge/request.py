"""What the edge's handlers read of a client request, and of the connection its answer goes to, whatever
HTTP server received it: ``EdgeRequest``.

``handlers``, ``exchange`` and ``head`` see a request through it only: its method, path, request target
and headers (``method``, ``path``, ``target``, ``headers``), its body (``read_body``: the size limit and the
timeout), its connection (``transport``, ``drain``, ``keep_alive``, ``http11``) and ``respond``, which
writes an answer ``head`` leaves to the server (one not plain: see ``head``). ``AiohttpRequest`` is
aiohttp's request seen so (every route of ``serve``'s app); ``WholeRequest`` one that the router's own
connection handler (``proxy.run.lean``) read whole, head and body, before handing it over.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiohttp import web
from aiohttp.http import HttpVersion11
from multidict import CIMultiDictProxy

from prefix_router.node import NodeState, read_body, too_large


class EdgeRequest:
    """A client request and its connection. ``path``: the raw path without the query; ``target``: the raw
    path and query (origin form, even when the client sent an absolute-form target); ``keep_alive``: the
    connection stays open after the answer unless the answer says otherwise; ``http11``: HTTP/1.1."""

    def __init__(
        self,
        state: NodeState,
        method: str,
        path: str,
        target: str,
        headers: CIMultiDictProxy[str],
        keep_alive: bool,
        http11: bool,
    ) -> None:
        self.state = state
        self.method = method
        self.path = path
        self.target = target
        self.headers = headers
        self.keep_alive = keep_alive
        self.http11 = http11

    def transport(self) -> asyncio.Transport | None:
        """The connection's transport; None once the client is gone."""
        raise NotImplementedError

    async def drain(self) -> None:
        """Wait while the connection's write buffer is over its high-water mark."""
        raise NotImplementedError

    async def read_body(self, limit: int, timeout_s: float) -> bytes:
        """The body (``read_body``'s contract: 413 over ``limit`` bytes, 408 slower than
        ``timeout_s``, decoded when it has a ``Content-Encoding``)."""
        raise NotImplementedError

    async def respond(self, response: web.StreamResponse) -> None:
        """Start ``response`` on the connection (aiohttp's ``prepare``): its head, then what the caller
        writes through it."""
        raise NotImplementedError

    def content_type(self) -> str:
        """The body's media type, lower case, without parameters (aiohttp's ``content_type``)."""
        value = self.headers.get("Content-Type")
        if not value:
            return "application/octet-stream"
        return value.split(";", 1)[0].strip().lower()


class AiohttpRequest(EdgeRequest):
    """aiohttp's request (``request``) as the edge reads it."""

    def __init__(self, state: NodeState, request: web.Request) -> None:
        super().__init__(
            state,
            request.method,
            request.rel_url.raw_path,
            request.rel_url.raw_path_qs,
            request.headers,
            request.keep_alive,
            request.version == HttpVersion11,
        )
        self.request = request

    def transport(self) -> asyncio.Transport | None:
        return self.request.transport

    async def drain(self) -> None:
        await self.request.writer.drain()

    async def read_body(self, limit: int, timeout_s: float) -> bytes:
        return await read_body(self.request, limit, timeout_s)

    async def respond(self, response: web.StreamResponse) -> None:
        await response.prepare(self.request)

    def content_type(self) -> str:
        return self.request.content_type


class Connection(Protocol):
    """What a ``WholeRequest`` needs of the connection it came on."""

    transport: asyncio.Transport | None

    async def drain(self) -> None: ...

    async def respond(self, request: WholeRequest, response: web.StreamResponse) -> None: ...


class WholeRequest(EdgeRequest):
    """A request read whole (its body within the size limit) by the router's own connection handler."""

    def __init__(
        self,
        state: NodeState,
        method: str,
        path: str,
        target: str,
        headers: CIMultiDictProxy[str],
        keep_alive: bool,
        body: bytes,
        connection: Connection,
    ) -> None:
        super().__init__(state, method, path, target, headers, keep_alive, True)
        self.body = body
        self.connection = connection

    def transport(self) -> asyncio.Transport | None:
        return self.connection.transport

    async def drain(self) -> None:
        await self.connection.drain()

    async def read_body(self, limit: int, timeout_s: float) -> bytes:
        if len(self.body) > limit:
            raise too_large(limit)
        return self.body

    async def respond(self, response: web.StreamResponse) -> None:
        await self.connection.respond(self, response)
