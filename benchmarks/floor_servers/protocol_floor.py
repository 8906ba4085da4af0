"""Floor server for ``benchmarks/floor.py``: the leanest Python HTTP/1.1 proxy we can write on the stack
we ship. An ``asyncio.Protocol`` on uvloop, requests parsed by llhttp (``httptools.HttpRequestParser``),
forwarded to one worker through the project's upstream client (``node.upstream.http_client.HttpUpstream``, the
``Upstream`` seam) and the answer relayed: a ``Content-Length`` answer whole, any other one as chunks as
they arrive (chunked transfer encoding). No routing, no JSON, no logging, no metrics: a measuring
instrument, not product code.

Minimal but correct for the benchmark: ``Content-Length`` request bodies, keep-alive (requests of one
connection answered in order; reading pauses while more than ``MAX_PENDING`` wait), writes that wait
while the transport's buffer is full, a 502 when the worker fails, the upstream exchange aborted when
the client goes away.

    python benchmarks/floor_servers/protocol_floor.py --port 8001 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import asyncio
import http
from collections import deque
from typing import cast

import httptools
from floor_common import BAD_GATEWAY, forward, read_whole, run_protocol

from prefix_router.node import HttpUpstream, UpstreamRequest, UpstreamResponse

MAX_PENDING = 8  # complete requests queued on one connection before reading pauses
Request = tuple[bytes, bytes, bytes, bytes, bool]  # method, target, content type, body, keep-alive


def status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


class FloorProtocol(asyncio.Protocol):
    """One client connection: parse, forward, relay; nothing else."""

    def __init__(self, upstream: HttpUpstream, base: str) -> None:
        self._upstream = upstream
        self._base = base
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._pending: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._reset()

    def _reset(self) -> None:
        self._target = b""
        self._content_type = b"application/json"
        self._body: list[bytes] = []

    # ---------------------------------------------------------------- transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._writable.set()
        if self._task is not None:
            self._task.cancel()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.write(status_line(400) + b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                self._transport.close()

    # ---------------------------------------------------------------- parser callbacks

    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self._content_type = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self._parser
        body = b"".join(self._body)
        self._pending.append(
            (parser.get_method(), self._target, self._content_type, body, parser.should_keep_alive())
        )
        if len(self._pending) >= MAX_PENDING and self._transport is not None:
            self._transport.pause_reading()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve())

    # ---------------------------------------------------------------- answering, in order

    async def _serve(self) -> None:
        try:
            while self._pending and self._transport is not None:
                method, target, content_type, body, keep_alive = self._pending.popleft()
                if len(self._pending) == MAX_PENDING - 1:
                    self._transport.resume_reading()
                await self._answer(method, target, content_type, body)
                if not keep_alive and self._transport is not None:
                    self._transport.close()
        finally:
            self._task = None

    async def _answer(self, method: bytes, target: bytes, content_type: bytes, body: bytes) -> None:
        request = UpstreamRequest(
            method.decode(), self._base + target.decode(), {"Content-Type": content_type.decode()}, body
        )
        await forward(self._upstream, request, self._relay, self._bad_gateway)

    def _bad_gateway(self) -> None:
        self._write_whole(502, b"application/json", BAD_GATEWAY)

    async def _relay(self, response: UpstreamResponse) -> None:
        content_type = response.headers.get("Content-Type", "application/octet-stream").encode()
        if "Content-Length" in response.headers:
            body = await read_whole(response)
            self._write_whole(response.status, content_type, body)
            return
        head = status_line(response.status) + b"Content-Type: " + content_type
        head += b"\r\nTransfer-Encoding: chunked\r\n\r\n"
        while chunk := await response.next_chunk():
            await self._write(head + b"%x\r\n%b\r\n" % (len(chunk), chunk))
            head = b""
        await self._write(head + b"0\r\n\r\n")

    def _write_whole(self, status: int, content_type: bytes, body: bytes) -> None:
        if self._transport is not None:
            head = status_line(status) + b"Content-Type: " + content_type
            self._transport.write(head + b"\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))

    async def _write(self, data: bytes) -> None:
        await self._writable.wait()
        if self._transport is None:
            raise ConnectionError("client gone")
        self._transport.write(data)


def main() -> None:
    run_protocol(__doc__, FloorProtocol)


if __name__ == "__main__":
    main()
