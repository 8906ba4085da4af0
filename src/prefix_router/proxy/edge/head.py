"""The router's own answers to the client: their heads and bodies written to the connection directly,
without aiohttp's response machinery (``web.Response`` and ``web.StreamResponse``: a headers object, the
head serialised and each piece written through aiohttp's stream writer; about 14 us of a plain request's
path in-process, the largest single step, and a few us per relayed chunk).

``sent`` writes a whole answer (head and body in one write) and returns its ``SentResponse``, which
the server (aiohttp's connection handler) finds prepared and ended. ``relay`` starts a relayed stream
(``Relay``: its head goes out with its first chunk, each chunk framed as HTTP/1.1 chunked transfer
encoding, the end with the terminating chunk). Either returns None for an answer that is not plain, and
writes nothing: the caller lets the server write it (``EdgeRequest.respond``). Plain: HTTP/1.1, a method
other than HEAD, a status of 200 or more other than 204 and 304 (the answers with a body), and for
``sent`` a body of at most ``MAX_BODY`` (what aiohttp writes without waiting on the client).

The bytes are aiohttp's for the same response (``tests/proxy/edge/test_head.py`` holds them to it): the
headers in their order, then ``Content-Length`` (whole) or ``Transfer-Encoding: chunked`` (relayed),
``Content-Type: application/octet-stream`` when a body has no type, ``Date``, ``Server``, and
``Connection: close`` when the connection is not kept alive (``kept_alive``: nor once the router stops).
The caller's headers carry none of those this module writes but ``Content-Type``
(``forward.downstream_headers`` drops them). A header with CR or
LF is refused (``ValueError``), as aiohttp refuses it. A write to a connection the client closed raises
``ConnectionResetError``; a relay waits (aiohttp's ``drain``) while the connection's write buffer is over
its high-water mark, so a slow reader holds at most one chunk more than that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from http import HTTPStatus
from typing import TypeAlias

from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE

from prefix_router.proxy.edge.request import EdgeRequest
from prefix_router.proxy.edge.responses import SentResponse

MAX_BODY = 2**16  # aiohttp's stream writer waits for the client past this many bytes written
REASONS = {status.value: status.phrase for status in HTTPStatus}
_SERVER = f"Server: {SERVER_SOFTWARE}"
Headers: TypeAlias = Sequence[tuple[str, str]]


def sent(request: EdgeRequest, status: int, headers: Headers, body: bytes) -> SentResponse | None:
    """Write a plain whole answer to ``request``'s connection; None: not a plain one, nothing written."""
    if len(body) > MAX_BODY or not plain(request, status):
        return None
    transport = open_transport(request)
    keep_alive = kept_alive(request)
    transport.write(head(status, headers, len(body), keep_alive) + body)
    return SentResponse(status, keep_alive, len(body))


def relay(request: EdgeRequest, status: int, headers: Headers) -> Relay | None:
    """A plain relayed stream to ``request``'s connection, nothing written yet; None: not a plain one."""
    if not plain(request, status):
        return None
    return Relay(request, status, headers)


class Relay:
    """A relayed stream: ``write`` each chunk as it comes, ``write_eof`` at its end, then ``response``."""

    def __init__(self, request: EdgeRequest, status: int, headers: Headers) -> None:
        self.request = request
        self.status = status
        self.keep_alive = kept_alive(request)
        self.pending = head(status, headers, None, self.keep_alive)  # the head, until the first write
        self.size = 0
        transport = request.transport()  # None: the client left, which the first write finds
        self.high_water = 0 if transport is None else transport.get_write_buffer_limits()[1]

    async def write(self, data: bytes) -> None:
        if not data:
            return
        transport = open_transport(self.request)
        transport.write(self.pending + b"%x\r\n%b\r\n" % (len(data), data))
        self.pending = b""
        self.size += len(data)
        if transport.get_write_buffer_size() > self.high_water:
            await self.request.drain()  # the client reads slowly: wait until it caught up

    async def write_eof(self) -> None:
        open_transport(self.request).write(self.pending + b"0\r\n\r\n")
        self.pending = b""

    def response(self) -> SentResponse:
        """What the server is given back: the answer, written."""
        return SentResponse(self.status, self.keep_alive, self.size)


def kept_alive(request: EdgeRequest) -> bool:
    """Whether the connection stays open after the answer: not once the router is stopping (the answer
    says ``Connection: close``, and the client reconnects to a replica that is not stopping)."""
    return request.keep_alive and not request.state.deadlines.stopping


def plain(request: EdgeRequest, status: int) -> bool:
    if status < 200 or status == 204 or status == 304:
        return False
    return request.method != "HEAD" and request.http11


def open_transport(request: EdgeRequest) -> asyncio.Transport:
    transport = request.transport()
    if transport is None or transport.is_closing():
        raise ConnectionResetError("Cannot write to closing transport")
    return transport


def head(status: int, headers: Headers, length: int | None, keep_alive: bool) -> bytes:
    """The HTTP/1.1 head of an answer of ``length`` body bytes (None: chunked)."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, '')}"]
    typed = False
    for name, value in headers:
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise ValueError("Newline or carriage return detected in a header")
        typed = typed or name.lower() == "content-type"
        lines.append(f"{name}: {value}")
    lines.append("Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}")
    if length != 0 and not typed:
        lines.append("Content-Type: application/octet-stream")
    lines.append(f"Date: {rfc822_formatted_time()}")
    lines.append(_SERVER)
    if not keep_alive:
        lines.append("Connection: close")
    lines.append("\r\n")
    return "\r\n".join(lines).encode()
