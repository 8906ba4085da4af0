"""The router's upstream HTTP/1.1 client: pooled keep-alive connections, responses parsed by llhttp
(through ``httptools``, the parser uvicorn uses), implementing the ``Upstream`` seam.

Chosen by measurement over aiohttp's client (``bench-overhead``; docs/benchmarks.md): the same exchange
costs the router about 100 us less CPU per request. All HTTP framing is llhttp's: status line, headers,
``Content-Length``/chunked bodies, and the refusals that stop response smuggling (duplicate or invalid
``Content-Length``, ``Transfer-Encoding`` with ``Content-Length``, broken chunk framing). This module
adds only what a reverse proxy needs around it:

- one request at a time per connection; a connection is reused only after a complete, clean response
  that did not ask to close, and never once bytes arrive that nobody asked for;
- a body without length or chunking ends when the connection closes (that connection is not reused);
  a response to ``HEAD`` has no body whatever its headers say (that connection is not reused either);
- interim ``1xx`` responses are skipped; a ``101`` is relayed as a body until close;
- flow control: reading pauses while more than ``MAX_BUFFERED`` body bytes wait for the consumer;
- bounded idle pools (per host and hosts), idle connections dropped after ``idle_timeout_s`` (under the
  5 s keep-alive of uvicorn-based engines), and one transparent resend when a reused idle connection
  turns out to have been closed by the server before answering (nothing was processed);
- headers with CR, LF or NUL are dropped from requests (no header injection).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import cast

import httptools
from multidict import CIMultiDict

from prefix_router.node.upstream.seam import UNENCODABLE, FailureKind, UpstreamError, UpstreamRequest

MAX_BUFFERED = 256 * 1024  # body bytes held before reading pauses
MAX_HEAD_BYTES = 64 * 1024  # status line and headers
Key = tuple[str, str, int]  # scheme, host, port


class ProtocolError(Exception):
    """The upstream broke HTTP/1.1 framing; the connection cannot be reused."""


class _Stale(Exception):
    """A reused connection closed before any response byte: safe to resend on a new one."""


class Connection:
    """One upstream connection and the state of its current exchange (parser callbacks included): an
    ``asyncio.Protocol`` by its methods, not by its base, so that the compiled build makes it a native
    class (its attributes read without a dictionary lookup)."""

    def __init__(self, key: Key) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.dead = False
        self.idle_since = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None  # asked once: each ask costs a getpid call
        self._parser = httptools.HttpResponseParser(self)
        self._reset(False)

    def _reset(self, head_only: bool) -> None:
        self.head_only = head_only
        self.active = False
        self.received = False
        self.status = 0
        self.headers: CIMultiDict[str] | None = None
        self.complete = False
        self.reusable = True
        self.raw_tail = False  # after a 101: the rest of the connection is the body
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._pieces: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = True
        if self.headers is not None and not self.complete and (self.raw_tail or self._until_close()):
            self.complete = True  # the body ran until close: that was its end
            self.reusable = False
        elif self.active and not self.complete and self._error is None:
            self._error = _Stale() if not self.received else ConnectionError(str(exc or "connection closed"))
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself

    def pause_writing(self) -> None:
        """A request is written whole at once and the response is awaited: nothing to hold back."""

    def resume_writing(self) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        if not self.active:  # unsolicited bytes on an idle connection
            self.abort()
            return
        self.received = True
        if self.raw_tail:
            self._add_piece(data)
        else:
            self._feed(data)
        if self.headers is None and not self.dead:  # llhttp does not bound the head: this does
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._error = ProtocolError("response head too large")
                self.abort()
        self._wake()

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:  # 101: whatever follows is the body, until close
            self.raw_tail, self.reusable = True, False
            offset = int(upgrade.args[0])
            if offset < len(data):
                self._add_piece(data[offset:])
        except (httptools.HttpParserError, ProtocolError) as exc:
            self._error = ProtocolError(str(exc) or type(exc).__name__)
            self.abort()

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        if self.complete:  # a second response nobody asked for
            raise ProtocolError("unsolicited response")
        self._raw_headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # interim response: wait for the real one
            return
        self.status = status
        self.headers = CIMultiDict(
            [
                (n.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
                for n, v in self._raw_headers
            ]
        )
        self.reusable = self._parser.should_keep_alive() and status != 101
        if self.head_only:  # a HEAD response's headers describe a body that is not sent
            self.complete, self.reusable = True, False

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self._add_piece(body)

    def on_message_complete(self) -> None:
        if self.headers is not None:
            self.complete = True

    # ------------------------------------------------------------------ body buffer

    def _add_piece(self, piece: bytes) -> None:
        self._pieces.append(piece)
        self._buffered += len(piece)
        if self._buffered > MAX_BUFFERED and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _take(self) -> bytes:
        """Everything received so far, in one piece (fewer writes downstream; nothing is held back)."""
        if len(self._pieces) == 1:
            piece = self._pieces.popleft()
        else:
            piece = b"".join(self._pieces)
            self._pieces.clear()
        self._buffered -= len(piece)
        if self._paused and self._buffered <= MAX_BUFFERED // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return piece

    def _until_close(self) -> bool:
        """Whether the current response's body is delimited by the connection closing."""
        headers = self.headers
        if headers is None or self.status in (204, 304):
            return False
        return "Content-Length" not in headers and not _chunked(headers.get("Transfer-Encoding", ""))

    # ------------------------------------------------------------------ consumer side

    def start(self, head: bytes, body: bytes, head_only: bool) -> None:
        self._reset(head_only)
        self.active = True
        assert self.transport is not None
        if body:
            self.transport.writelines((head, body))
        else:
            self.transport.write(head)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def wait_head(self) -> tuple[int, CIMultiDict[str]]:
        while self.headers is None:
            if self._error is not None:
                raise self._error
            await self._wait()
        return self.status, self.headers

    async def next_chunk(self) -> bytes:
        while True:
            if self._pieces:
                return self._take()
            if self.complete:
                return b""
            if self._error is not None:
                raise UpstreamError(FailureKind.IO, f"upstream closed mid-body: {self._error}"[:300])
            await self._wait()

    def finished_cleanly(self) -> bool:
        clean = self.complete and not self._pieces and self.reusable
        return clean and not self.dead and self._error is None

    def abort(self) -> None:
        self.dead = True
        if self.transport is not None:
            self.transport.abort()


def _chunked(encoding: str) -> bool:
    return encoding.rsplit(",", 1)[-1].strip().lower() == "chunked"


class HttpResponse:
    """``UpstreamResponse`` over one pooled connection."""

    __slots__ = ("_conn", "_pool", "headers", "status")

    def __init__(self, conn: Connection, status: int, headers: CIMultiDict[str], pool: HttpUpstream) -> None:
        self._conn = conn
        self._pool = pool
        self.status = status
        self.headers: Mapping[str, str] = headers

    async def next_chunk(self) -> bytes:
        return await self._conn.next_chunk()

    def release(self) -> None:
        conn = self._conn
        conn.active = False
        if conn.finished_cleanly():
            self._pool.put_back(conn)
        else:
            conn.abort()

    def abort(self) -> None:
        self._conn.abort()


class HttpUpstream:
    """Pooled keep-alive HTTP/1.1 connections per (scheme, host, port), bounded."""

    def __init__(
        self,
        connect_timeout_s: float,
        max_idle_per_host: int = 256,
        idle_timeout_s: float = 4.0,
        max_hosts: int = 1024,
        max_urls: int = 4096,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._max_idle = max_idle_per_host
        self._idle_timeout_s = idle_timeout_s
        self._max_hosts = max_hosts
        self._idle: OrderedDict[Key, deque[Connection]] = OrderedDict()
        self._ssl: ssl.SSLContext | None = None
        # URLs already split (a worker's few paths, every request): emptied when full, so bounded
        self._max_urls = max_urls
        self._urls: dict[str, tuple[Key, str, str]] = {}

    async def send(self, request: UpstreamRequest) -> HttpResponse:
        key, target, authority = self._split(request.url)
        head = encode_head(request, key, target, authority)
        head_only = request.method == "HEAD"
        conn = self._take_idle(key)
        if conn is not None:
            try:
                return await self._exchange(conn, head, request.body, head_only)
            except _Stale:
                pass  # the server had closed it: resend once on a fresh connection
        try:
            return await self._exchange(await self._connect(key), head, request.body, head_only)
        except _Stale:
            raise UpstreamError(FailureKind.IO, "connection closed before any response") from None

    def _split(self, url: str) -> tuple[Key, str, str]:
        """``split_url`` and the ``Host`` header's value, remembered per URL."""
        found = self._urls.get(url)
        if found is None:
            key, target = split_url(url)
            if len(self._urls) >= self._max_urls:
                self._urls.clear()
            found = self._urls[url] = (key, target, host_header(key))
        return found

    def url_count(self) -> int:
        return len(self._urls)

    async def _exchange(self, conn: Connection, head: bytes, body: bytes, head_only: bool) -> HttpResponse:
        try:
            conn.start(head, body, head_only)
            status, headers = await conn.wait_head()
        except (_Stale, asyncio.CancelledError):
            conn.abort()
            raise
        except (ProtocolError, ConnectionError, OSError) as exc:
            conn.abort()
            raise UpstreamError(FailureKind.IO, f"{type(exc).__name__}: {exc}"[:300]) from None
        return HttpResponse(conn, status, headers, self)

    async def _connect(self, key: Key) -> Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    cast(Callable[[], asyncio.Protocol], lambda: Connection(key)),
                    host,
                    port,
                    ssl=self._ssl_context() if scheme == "https" else None,
                )
        except TimeoutError:
            raise UpstreamError(FailureKind.CONNECT, f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise UpstreamError(
                FailureKind.CONNECT, f"connect to {host}:{port}: {exc.strerror or exc}"
            ) from None
        return cast(Connection, conn)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _take_idle(self, key: Key) -> Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.dead and now - conn.idle_since < self._idle_timeout_s:
                return conn
            conn.abort()
        return None

    def put_back(self, conn: Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = deque()
            while len(self._idle) > self._max_hosts:
                _, dropped = self._idle.popitem(last=False)
                for old in dropped:
                    old.abort()
        self._idle.move_to_end(conn.key)
        conn.idle_since = time.monotonic()
        idle.append(conn)
        while len(idle) > self._max_idle:
            idle.popleft().abort()

    def idle_count(self) -> int:
        return sum(len(q) for q in self._idle.values())

    def host_count(self) -> int:
        return len(self._idle)

    async def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()


def split_url(url: str) -> tuple[Key, str]:
    """``http://host:port/path?q`` -> ((scheme, host, port), "/path?q")."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise UpstreamError(FailureKind.CONNECT, f"unsupported URL {url[:80]!r}")
    netloc, _, path = rest.partition("/")
    host, port = split_netloc(netloc, 443 if scheme == "https" else 80)
    return (scheme, host, port), "/" + path


def split_netloc(netloc: str, default_port: int) -> tuple[str, int]:
    if netloc.startswith("["):  # [v6]:port
        host, _, tail = netloc[1:].partition("]")
        return host, int(tail[1:]) if tail.startswith(":") else default_port
    host, sep, port = netloc.rpartition(":")
    if sep and port.isdigit():
        return host, int(port)
    return netloc, default_port


def host_header(key: Key) -> str:
    """The ``Host`` header's value for (scheme, host, port): the port only when not the scheme's default."""
    scheme, host, port = key
    default = 443 if scheme == "https" else 80
    if ":" in host:
        return f"[{host}]" if port == default else f"[{host}]:{port}"
    return host if port == default else f"{host}:{port}"


def encode_head(request: UpstreamRequest, key: Key, target: str, authority: str | None = None) -> bytes:
    """The request line and headers (``authority``: ``host_header(key)``, if already known). A header with
    CR, LF or NUL is refused (no header injection): the request fails before anything is sent (a failure of
    this worker, retried elsewhere)."""
    if authority is None:
        authority = host_header(key)
    lines = [f"{request.method} {target} HTTP/1.1", f"Host: {authority}"]
    lines += [f"{k}: {v}" for k, v in request.headers.items()]
    head = "\r\n".join(lines)
    breaks = len(lines) - 1  # a CR or LF anywhere else is inside a line
    if head.count("\n") != breaks or head.count("\r") != breaks or "\0" in head:
        raise UpstreamError(FailureKind.CONNECT, UNENCODABLE)
    if request.body or request.method in ("POST", "PUT", "PATCH"):
        head += f"\r\nContent-Length: {len(request.body)}"
    return (head + "\r\n\r\n").encode("utf-8", "surrogateescape")
