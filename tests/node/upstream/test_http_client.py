"""The upstream HTTP/1.1 client (llhttp through httptools): framing and its refusals, keep-alive reuse,
stale connections, bounds and flow control."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefix_router.node.upstream import http_client
from prefix_router.node.upstream.http_client import Connection, HttpUpstream, encode_head, split_url
from prefix_router.node.upstream.seam import UpstreamError, UpstreamRequest

# ---------------------------------------------------------------------------------------------- framing


class FakeTransport:
    """Just enough of a transport for a ``Connection`` fed by hand."""

    def __init__(self) -> None:
        self.written = b""
        self.aborted = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, parts: Any) -> None:
        self.written += b"".join(parts)

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def fed(pieces: list[bytes], method: str = "POST", close: bool = False) -> Connection:
    """A connection that sent one request and then received ``pieces`` (and EOF when ``close``)."""
    conn = Connection(("http", "h", 80))
    conn.connection_made(FakeTransport())  # type: ignore[arg-type]
    conn.start(b"X", b"", method == "HEAD")
    for piece in pieces:
        if not conn.dead:
            conn.data_received(piece)
    if close:
        conn.connection_lost(None)
    return conn


def body_of(conn: Connection) -> bytes:
    """The body received so far, taken as the consumer takes it."""
    return conn._take() if conn._pieces else b""


def chunked(pieces: list[bytes], trailers: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n" + trailers + b"\r\n"


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@given(
    st.lists(st.binary(min_size=1, max_size=50), max_size=8),
    st.lists(st.integers(min_value=1, max_value=400), max_size=10),
    st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n\r\n", b"garbage"]),
)
def test_chunked_decoding_under_any_split(pieces: list[bytes], cuts: list[int], after: bytes) -> None:
    wire = CHUNKED_HEAD + chunked(pieces, b"X-Trailer: 1\r\n") + after
    points = sorted({0, len(wire), *(c for c in cuts if c < len(wire))})
    conn = fed([wire[start:end] for start, end in itertools.pairwise(points)])
    assert conn.complete and body_of(conn) == b"".join(pieces)
    assert conn.finished_cleanly() is (after == b"")  # bytes nobody asked for: never reused


@pytest.mark.parametrize("body", [b"zz\r\n", b"-1\r\n", b"0x10\r\n", b"5\r\nabcdeXX", b"f" * 5000 + b"\r\n"])
def test_bad_chunked_framing_is_refused(body: bytes) -> None:
    conn = fed([CHUNKED_HEAD, body])
    assert conn.dead and not conn.complete and isinstance(conn._error, http_client.ProtocolError)


def test_length_body_stops_at_its_length() -> None:
    conn = fed([b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc"])
    assert body_of(conn) == b"abc" and not conn.complete
    conn.data_received(b"de")
    assert body_of(conn) == b"de" and conn.complete and conn.finished_cleanly()


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",  # smuggling: two lengths
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",  # CL with TE
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 X\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n X: folded\r\n\r\n",
        b"SMTP ready\r\n\r\n",
    ],
)
def test_malformed_and_ambiguous_heads_are_refused(head: bytes) -> None:
    conn = fed([head + b"abc"])
    assert conn.dead and conn.headers is None and isinstance(conn._error, http_client.ProtocolError)


def test_a_head_without_end_is_bounded() -> None:
    conn = fed([b"HTTP/1.1 200 OK\r\n"] + [b"X-Long: " + b"a" * 8000 + b"\r\n"] * 10)
    assert conn.dead and "too large" in str(conn._error)


def test_body_framing_rules() -> None:
    head = fed([b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"], method="HEAD")
    assert head.complete and body_of(head) == b"" and not head.finished_cleanly()
    no_content = fed([b"HTTP/1.1 204 No Content\r\n\r\n"])
    assert no_content.complete and no_content.finished_cleanly()
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked([b"zz"])
    assert body_of(fed([wire])) == b"zz"
    for wire in (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc", b"HTTP/1.1 200 OK\r\n\r\nabc"):
        open_ended = fed([wire])
        assert not open_ended.complete  # until the connection closes
        open_ended.connection_lost(None)
        assert open_ended.complete and body_of(open_ended) == b"abc" and not open_ended.finished_cleanly()


def test_heads_keep_alive_and_interim_responses() -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    conn = fed([interim + b"HTTP/1.1 201 Created\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0\r\n\r\n"])
    assert conn.status == 201 and conn.headers is not None and conn.headers.getall("X-A") == ["1", "2"]
    assert conn.finished_cleanly()
    assert not fed([b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"]).finished_cleanly()
    assert not fed([b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"]).finished_cleanly()
    cut = fed([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"], close=True)
    assert not cut.complete and isinstance(cut._error, ConnectionError)


def test_unsolicited_bytes_on_an_idle_connection_close_it() -> None:
    conn = fed([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"])
    conn.active = False
    conn.data_received(b"HTTP/1.1 200 OK\r\n")
    assert conn.dead


def test_urls_and_request_encoding() -> None:
    assert split_url("http://h:81/a/v1/x?q=1") == (("http", "h", 81), "/a/v1/x?q=1")
    assert split_url("https://h/v1") == (("https", "h", 443), "/v1")
    assert split_url("http://[::1]:9/p") == (("http", "::1", 9), "/p")
    request = UpstreamRequest("POST", "http://h:81/v1/x", {"X-Ok": "1"}, b"{}")
    raw = encode_head(request, ("http", "h", 81), "/v1/x")
    assert raw == b"POST /v1/x HTTP/1.1\r\nHost: h:81\r\nX-Ok: 1\r\nContent-Length: 2\r\n\r\n"
    for bad in ("a\r\nInjected: 1", "key\n", "a\0b"):  # header injection: refused, nothing encoded
        request = UpstreamRequest("POST", "http://h:81/v1/x", {"X-Ok": "1", "X-Bad": bad}, b"{}")
        with pytest.raises(UpstreamError) as refused:
            encode_head(request, ("http", "h", 81), "/v1/x")
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


async def fetch(upstream: HttpUpstream, port: int, method: str = "POST") -> tuple[int, bytes]:
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
    upstream = HttpUpstream(1.0)
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
    upstream = HttpUpstream(1.0)
    assert await fetch(upstream, port) == (200, b"ok")
    await asyncio.sleep(0.05)
    assert await fetch(upstream, port) == (200, b"ok")
    assert len(connections) == 2


async def test_until_close_bodies_interim_responses_and_chunked(raw_server: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 1:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            writer.write(CHUNKED_HEAD)
            writer.write(chunked([b"hello ", b"world"]))
            await read_request(reader)  # still reusable afterwards
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil close")

    port, connections = await raw_server(serve)
    upstream = HttpUpstream(1.0)
    assert await fetch(upstream, port) == (200, b"hello world")
    assert await fetch(upstream, port) == (200, b"until close")
    assert upstream.idle_count() == 0  # an until-close connection is never reused
    assert len(connections) == 1


async def test_garbage_and_refusals_are_upstream_errors(raw_server: Any, free_port: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")

    port, _ = await raw_server(serve)
    upstream = HttpUpstream(1.0)
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
        await fetch(HttpUpstream(1.0), port)


async def test_idle_pool_is_bounded(raw_server: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            await asyncio.sleep(0.02)
            writer.write(OK)

    port, connections = await raw_server(serve)
    upstream = HttpUpstream(1.0, max_idle_per_host=2)
    await asyncio.gather(*(fetch(upstream, port) for _ in range(6)))
    assert len(connections) == 6 and upstream.idle_count() == 2


async def test_hosts_in_the_pool_are_bounded(raw_server: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(OK)

    ports = [(await raw_server(serve))[0] for _ in range(4)]
    upstream = HttpUpstream(1.0, max_hosts=2)
    for port in ports:
        await fetch(upstream, port)
    assert upstream.host_count() == 2 and upstream.idle_count() == 2


async def test_reading_pauses_while_the_consumer_lags(raw_server: Any) -> None:
    size = 4 * 1024 * 1024

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()

    port, _ = await raw_server(serve)
    resp = await HttpUpstream(1.0).send(UpstreamRequest("GET", f"http://127.0.0.1:{port}/", {}, b""))
    await asyncio.sleep(0.3)  # the server pushes as fast as it can; nobody reads
    conn = resp._conn
    assert conn._paused and conn._buffered < http_client.MAX_BUFFERED + 1024 * 1024
    total = 0
    while chunk := await resp.next_chunk():
        total += len(chunk)
    assert total == size
    resp.release()


async def test_remembered_urls_are_bounded(raw_server: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(OK)

    port, _ = await raw_server(serve)
    upstream = HttpUpstream(1.0, max_urls=3)
    for i in range(10):
        request = UpstreamRequest("GET", f"http://127.0.0.1:{port}/v1/p{i}", {}, b"")
        response = await upstream.send(request)
        assert response.status == 200
        while await response.next_chunk():
            pass
        response.release()
        assert 1 <= upstream.url_count() <= 3
    await upstream.close()
