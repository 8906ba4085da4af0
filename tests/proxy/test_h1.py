"""The lean HTTP/1.1 upstream client: framing, keep-alive reuse, stale connections, bounds."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from prefix_router.proxy import h1client
from prefix_router.proxy.h1client import H1Upstream, encode_request, split_url
from prefix_router.proxy.h1parse import (
    ChunkedBody,
    Head,
    LengthBody,
    NoBody,
    ProtocolError,
    UntilCloseBody,
    body_framer,
    parse_head,
)
from prefix_router.proxy.upstream import UpstreamError, UpstreamRequest

# ---------------------------------------------------------------------------------------------- framing


def chunked(pieces: list[bytes], trailers: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n" + trailers + b"\r\n"


@given(
    st.lists(st.binary(min_size=1, max_size=50), max_size=8),
    st.lists(st.integers(min_value=1, max_value=400), max_size=10),
    st.binary(max_size=10),
)
def test_chunked_decoding_under_any_split(pieces: list[bytes], cuts: list[int], after: bytes) -> None:
    wire = chunked(pieces, b"X-Trailer: 1\r\n") + after
    points = sorted({0, len(wire), *(c for c in cuts if c < len(wire))})
    framer, body, rest = ChunkedBody(), b"", b""
    for start, end in itertools.pairwise(points):
        if framer.done:
            rest += wire[start:end]
            continue
        got, extra = framer.feed(wire[start:end])
        body += b"".join(got)
        rest += extra
    assert framer.done and body == b"".join(pieces) and rest == after


@pytest.mark.parametrize("wire", [b"zz\r\n", b"-1\r\n", b"0x10\r\n", b"5\r\nabcdeXX", b"f" * 5000])
def test_bad_chunked_framing_is_refused(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        ChunkedBody().feed(wire)


def test_length_body_stops_at_its_length() -> None:
    framer = LengthBody(5)
    assert framer.feed(b"abc") == ([b"abc"], b"") and not framer.done
    assert framer.feed(b"defgh") == ([b"de"], b"fgh") and framer.done


def head(status: int, *headers: tuple[str, str]) -> Head:
    return Head(status, CIMultiDict(headers), (1, 1))


def test_body_framing_rules() -> None:
    assert isinstance(body_framer(head(200, ("Content-Length", "3")), "HEAD"), NoBody)
    assert isinstance(body_framer(head(204), "GET"), NoBody)
    assert isinstance(body_framer(head(200, ("Transfer-Encoding", "gzip, chunked")), "GET"), ChunkedBody)
    assert isinstance(body_framer(head(200, ("Transfer-Encoding", "gzip")), "GET"), UntilCloseBody)
    assert isinstance(body_framer(head(200), "GET"), UntilCloseBody)
    with pytest.raises(ProtocolError):
        body_framer(head(200, ("Content-Length", "3"), ("Content-Length", "4")), "GET")
    with pytest.raises(ProtocolError):
        body_framer(head(200, ("Content-Length", "-3")), "GET")


def test_head_parsing() -> None:
    parsed = parse_head(b"HTTP/1.1 201 Created\r\nX-A: 1\r\nx-a: 2\r\nConnection: close")
    assert parsed.status == 201 and parsed.headers.getall("X-A") == ["1", "2"] and not parsed.keep_alive()
    assert not parse_head(b"HTTP/1.0 200 OK").keep_alive()
    bad_heads = (b"HTTP/2 200 OK", b"HTTP/1.1 2000 X", b"HTTP/1.1 200 OK\r\nno colon", b"HTTP/1.1 200\r\n X:")
    for bad in bad_heads:
        with pytest.raises(ProtocolError):
            parse_head(bad)


def test_urls_and_request_encoding() -> None:
    assert split_url("http://h:81/a/v1/x?q=1") == (("http", "h", 81), "/a/v1/x?q=1")
    assert split_url("https://h/v1") == (("https", "h", 443), "/v1")
    assert split_url("http://[::1]:9/p") == (("http", "::1", 9), "/p")
    request = UpstreamRequest("POST", "http://h:81/v1/x", {"X-Ok": "1"}, b"{}")
    raw = encode_request(request, ("http", "h", 81), "/v1/x")
    assert raw.startswith(b"POST /v1/x HTTP/1.1\r\nHost: h:81\r\nX-Ok: 1\r\nContent-Length: 2\r\n\r\n{}")
    for bad in ("a\r\nInjected: 1", "key\n", "a\0b"):  # header injection: refused, nothing encoded
        request = UpstreamRequest("POST", "http://h:81/v1/x", {"X-Ok": "1", "X-Bad": bad}, b"{}")
        with pytest.raises(UpstreamError) as refused:
            encode_request(request, ("http", "h", 81), "/v1/x")
        assert refused.value.kind == "connect"
    with pytest.raises(UpstreamError):
        split_url("ftp://h/x")


# ---------------------------------------------------------------------------------------------- live

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Script], Awaitable[tuple[int, list[int]]]]]:
    """Start a raw TCP server running ``script(reader, writer, connection_number)`` per connection."""
    servers: list[asyncio.Server] = []

    async def start(script: Script) -> tuple[int, list[int]]:
        connections: list[int] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(len(connections))
            try:
                await script(reader, writer, len(connections))
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return server.sockets[0].getsockname()[1], connections

    try:
        yield start
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()


async def fetch(upstream: H1Upstream, port: int, method: str = "POST") -> tuple[int, bytes]:
    resp = await upstream.send(UpstreamRequest(method, f"http://127.0.0.1:{port}/v1/x", {}, b"{}"))
    body = b""
    while chunk := await resp.next_chunk():
        body += chunk
    resp.release()
    return resp.status, body


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def test_keep_alive_connections_are_reused(raw_server: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(OK)

    port, connections = await raw_server(serve)
    upstream = H1Upstream(1.0)
    for _ in range(5):
        assert await fetch(upstream, port) == (200, b"ok")
    assert len(connections) == 1
    await upstream.close()


async def test_a_stale_idle_connection_is_replaced_transparently(raw_server: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(OK)  # keep-alive advertised, then the server closes anyway
        await writer.drain()

    port, connections = await raw_server(serve)
    upstream = H1Upstream(1.0)
    assert await fetch(upstream, port) == (200, b"ok")
    await asyncio.sleep(0.05)
    assert await fetch(upstream, port) == (200, b"ok")
    assert len(connections) == 2


async def test_until_close_bodies_interim_responses_and_chunked(raw_server: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 1:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(chunked([b"hello ", b"world"]))
            await read_request(reader)  # still reusable afterwards
            writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil close")
        else:
            writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil close")

    port, connections = await raw_server(serve)
    upstream = H1Upstream(1.0)
    assert await fetch(upstream, port) == (200, b"hello world")
    assert await fetch(upstream, port) == (200, b"until close")
    assert upstream.idle_count() == 0  # an until-close connection is never reused
    assert len(connections) == 1


async def test_garbage_and_refusals_are_upstream_errors(raw_server: Any, free_port: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")

    port, _ = await raw_server(serve)
    upstream = H1Upstream(1.0)
    with pytest.raises(UpstreamError) as info:
        await fetch(upstream, port)
    assert info.value.kind == "io"
    with pytest.raises(UpstreamError) as info:
        await fetch(upstream, free_port())
    assert info.value.kind == "connect"


async def test_a_body_cut_short_is_an_error(raw_server: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")

    port, _ = await raw_server(serve)
    with pytest.raises(UpstreamError, match="mid-body"):
        await fetch(H1Upstream(1.0), port)


async def test_idle_pool_is_bounded(raw_server: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            await asyncio.sleep(0.02)
            writer.write(OK)

    port, connections = await raw_server(serve)
    upstream = H1Upstream(1.0, max_idle_per_host=2)
    await asyncio.gather(*(fetch(upstream, port) for _ in range(6)))
    assert len(connections) == 6 and upstream.idle_count() == 2


async def test_hosts_in_the_pool_are_bounded(raw_server: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(OK)

    ports = [(await raw_server(serve))[0] for _ in range(4)]
    upstream = H1Upstream(1.0, max_hosts=2)
    for port in ports:
        await fetch(upstream, port)
    assert len(upstream._idle) == 2 and upstream.idle_count() == 2


async def test_reading_pauses_while_the_consumer_lags(raw_server: Any) -> None:
    size = 4 * 1024 * 1024

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()

    port, _ = await raw_server(serve)
    resp = await H1Upstream(1.0).send(UpstreamRequest("GET", f"http://127.0.0.1:{port}/", {}, b""))
    await asyncio.sleep(0.3)  # the server pushes as fast as it can; nobody reads
    conn = resp._conn
    assert conn._paused and conn._buffered < h1client.MAX_BUFFERED + 1024 * 1024
    total = 0
    while chunk := await resp.next_chunk():
        total += len(chunk)
    assert total == size
    resp.release()
