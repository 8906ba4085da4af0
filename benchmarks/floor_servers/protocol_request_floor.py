"""Floor server for ``benchmarks/floor.py``: the protocol floor's connection handling (``asyncio.Protocol``
on uvloop, requests parsed by llhttp through ``httptools``), each request then made into aiohttp's request
objects (``web.Request`` with its ``StreamReader`` body and its ``StreamWriter``, as aiohttp's server makes
them) and answered by the handler of the ``aiohttp-direct`` floor (``floor_common.answer_as_router``).
Beside ``protocol`` and ``aiohttp-direct`` it shows what a lean edge that kept aiohttp's request objects for
the router's handlers would save: a measuring instrument, not product code.

Minimal but correct for the benchmark, like ``protocol_floor``: ``Content-Length`` request bodies,
keep-alive (requests of one connection answered in order; reading pauses while more than ``MAX_PENDING``
wait), writes that wait while the transport's buffer is full (aiohttp's ``BaseProtocol``), the handler
cancelled when the client goes away.

    python benchmarks/floor_servers/protocol_request_floor.py --port 8001 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import asyncio
from collections import deque

import httptools
from aiohttp import StreamReader, web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http import HttpVersion10, HttpVersion11
from aiohttp.http_parser import RawRequestMessage
from aiohttp.http_writer import StreamWriter
from floor_common import answer_as_router, run_protocol
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from prefix_router.node import HttpUpstream

BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
MAX_PENDING = 8  # complete requests queued on one connection before reading pauses
READ_LIMIT = 2**16  # aiohttp's StreamReader limit, as its server sets it


class RequestProtocol(BaseProtocol):
    """One client connection: parse, make aiohttp's request, answer (in order); nothing else."""

    def __init__(self, upstream: HttpUpstream, base: str) -> None:
        super().__init__(asyncio.get_running_loop())
        self._upstream = upstream
        self._base = base
        self._request_parser = httptools.HttpRequestParser(self)
        self._pending: deque[web.Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self.peername = self.sockname = ("127.0.0.1", 0)  # what aiohttp's request may ask its protocol
        self.ssl_context = None
        self._reset()

    def _reset(self) -> None:
        self._target = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []

    # ---------------------------------------------------------------- transport callbacks

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._task is not None:
            self._task.cancel()

    def pause_reading(self) -> None:
        """What a full ``StreamReader`` asks: nothing to hold back, the body it holds came whole."""

    def resume_reading(self, resume_parser: bool = True) -> None:
        """See ``pause_reading``."""

    def data_received(self, data: bytes) -> None:
        try:
            self._request_parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                self.transport.close()

    # ---------------------------------------------------------------- parser callbacks

    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._pending.append(self._request())
        if len(self._pending) >= MAX_PENDING and self.transport is not None:
            self.transport.pause_reading()
        if self._task is None:
            self._task = self._loop.create_task(self._serve())

    def _request(self) -> web.Request:
        """The request just parsed, as aiohttp's server would hand it to a handler."""
        parser, raw = self._request_parser, tuple(self._headers)
        headers = CIMultiDictProxy(CIMultiDict((n.decode("latin-1"), v.decode("latin-1")) for n, v in raw))
        path = self._target.decode("utf-8", "surrogateescape")
        version = HttpVersion11 if parser.get_http_version() == "1.1" else HttpVersion10
        message = RawRequestMessage(
            parser.get_method().decode(), path, version, headers, raw, not parser.should_keep_alive(),
            None, False, False, URL(path, encoded=True),
        )  # fmt: skip
        payload = StreamReader(self, READ_LIMIT, loop=self._loop)
        for piece in self._body:
            payload.feed_data(piece)
        payload.feed_eof()
        writer = StreamWriter(self, self._loop)
        return web.Request(message, payload, self, writer, asyncio.current_task(self._loop), self._loop)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- answering, in order

    async def _serve(self) -> None:
        try:
            while self._pending and self.transport is not None:
                request = self._pending.popleft()
                if len(self._pending) == MAX_PENDING - 1:
                    self.transport.resume_reading()
                response = await answer_as_router(self._upstream, self._base, request, await request.read())
                if not response.prepared:  # left to aiohttp's writer by ``head``
                    await response.prepare(request)
                    await response.write_eof()
                if not response.keep_alive and self.transport is not None:
                    self.transport.close()
        finally:
            self._task = None


def main() -> None:
    run_protocol(__doc__, RequestProtocol)


if __name__ == "__main__":
    main()
