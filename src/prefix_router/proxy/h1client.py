"""A lean pooled HTTP/1.1 client implementing the ``Upstream`` seam (opt-in: ``upstream_client: h1``;
the default is aiohttp's client, see ``prefix_router.proxy.upstream``).

Measured by ``bench-overhead``: the aiohttp client costs the router about 150-190 microseconds of CPU per
request, this one a fraction of that. It does only what a reverse proxy needs: one request at a time per
keep-alive connection, ``Content-Length``/chunked/until-close bodies, flow control (reading pauses while
the consumer lags), bounded idle pools, and one transparent retry when a reused idle connection turns
out to have been closed by the server before answering (nothing was processed).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import cast

from prefix_router.proxy.h1parse import BodyFramer, Head, ProtocolError, body_framer, find_head, parse_head
from prefix_router.proxy.upstream import UNENCODABLE, FailureKind, UpstreamError, UpstreamRequest

MAX_BUFFERED = 256 * 1024  # body bytes held before reading pauses
Key = tuple[str, str, int]  # scheme, host, port


class _Stale(Exception):
    """A reused connection closed before any response byte: safe to resend on a new one."""


class Connection(asyncio.Protocol):
    """One upstream connection and the state of its current exchange."""

    def __init__(self, key: Key) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.dead = False
        self.idle_since = 0.0
        self._reset("GET")

    def _reset(self, method: str) -> None:
        self.method = method
        self.active = False
        self.received = False
        self.head: Head | None = None
        self.framer: BodyFramer | None = None
        self.reusable = True
        self._head_buf = bytearray()
        self._pieces: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = True
        if self.framer is not None and self.framer.until_close and not self.framer.done:
            self.framer.done = True
            self.reusable = False
        elif self.active and not (self.framer is not None and self.framer.done):
            self._error = _Stale() if not self.received else ConnectionError(str(exc or "connection closed"))
        self._wake()

    def data_received(self, data: bytes) -> None:
        if not self.active:  # unsolicited bytes on an idle connection
            self.dead = True
            self.abort()
            return
        self.received = True
        try:
            if self.framer is None:
                self._head_bytes(data)
            else:
                self._body_bytes(data)
        except ProtocolError as exc:
            self._error = exc
            self.abort()
        self._wake()

    def _head_bytes(self, data: bytes) -> None:
        self._head_buf += data
        end = find_head(self._head_buf)
        if end < 0:
            return
        head = parse_head(bytes(self._head_buf[: end - 4]))
        rest = bytes(self._head_buf[end:])
        self._head_buf.clear()
        if 100 <= head.status < 200 and head.status != 101:  # interim response: wait for the real one
            if rest:
                self._head_bytes(rest)
            return
        self.head = head
        self.framer = body_framer(head, self.method)
        self.reusable = head.keep_alive() and head.status != 101  # no protocol upgrades through the pool
        if rest:
            self._body_bytes(rest)

    def _body_bytes(self, data: bytes) -> None:
        assert self.framer is not None
        if self.framer.done:
            self.reusable = False
            return
        pieces, extra = self.framer.feed(data)
        if extra:
            self.reusable = False
        for piece in pieces:
            self._pieces.append(piece)
            self._buffered += len(piece)
        if self._buffered > MAX_BUFFERED and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------------ consumer side

    def start(self, method: str, data: bytes) -> None:
        self._reset(method)
        self.active = True
        assert self.transport is not None
        self.transport.write(data)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def wait_head(self) -> Head:
        while self.head is None:
            if self._error is not None:
                raise self._error
            await self._wait()
        return self.head

    async def next_chunk(self) -> bytes:
        while True:
            if self._pieces:
                return self._take()
            if self.framer is not None and self.framer.done:
                self.active = False
                return b""
            if self._error is not None:
                raise UpstreamError(FailureKind.IO, f"upstream closed mid-body: {self._error}")
            await self._wait()

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

    def finished_cleanly(self) -> bool:
        done = self.framer is not None and self.framer.done and not self._pieces
        return done and self.reusable and not self.dead and self._error is None

    def abort(self) -> None:
        self.dead = True
        if self.transport is not None:
            self.transport.abort()


class H1Response:
    """``UpstreamResponse`` over one pooled connection."""

    __slots__ = ("_conn", "_pool", "headers", "status")

    def __init__(self, conn: Connection, head: Head, pool: H1Upstream) -> None:
        self._conn = conn
        self._pool = pool
        self.status = head.status
        self.headers: Mapping[str, str] = head.headers

    async def next_chunk(self) -> bytes:
        return await self._conn.next_chunk()

    def release(self) -> None:
        if self._conn.finished_cleanly():
            self._pool.put_back(self._conn)
        else:
            self._conn.abort()

    def abort(self) -> None:
        self._conn.abort()


class H1Upstream:
    """Pooled keep-alive HTTP/1.1 connections per (scheme, host, port), bounded."""

    def __init__(
        self,
        connect_timeout_s: float,
        max_idle_per_host: int = 256,
        idle_timeout_s: float = 4.0,
        max_hosts: int = 1024,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._max_idle = max_idle_per_host
        self._idle_timeout_s = idle_timeout_s  # under uvicorn's 5 s keep-alive (vLLM, SGLang)
        self._max_hosts = max_hosts
        self._idle: OrderedDict[Key, deque[Connection]] = OrderedDict()
        self._ssl: ssl.SSLContext | None = None

    async def send(self, request: UpstreamRequest) -> H1Response:
        key, target = split_url(request.url)
        data = encode_request(request, key, target)
        conn = self._take_idle(key)
        if conn is not None:
            try:
                return await self._exchange(conn, request.method, data)
            except _Stale:
                pass  # the server had closed it: resend once on a fresh connection
        try:
            return await self._exchange(await self._connect(key), request.method, data)
        except _Stale:
            raise UpstreamError(FailureKind.IO, "connection closed before any response") from None

    async def _exchange(self, conn: Connection, method: str, data: bytes) -> H1Response:
        try:
            conn.start(method, data)
            head = await conn.wait_head()
        except (_Stale, asyncio.CancelledError):
            conn.abort()
            raise
        except (ProtocolError, ConnectionError, OSError) as exc:
            conn.abort()
            raise UpstreamError(FailureKind.IO, f"{type(exc).__name__}: {exc}"[:300]) from None
        return H1Response(conn, head, self)

    async def _connect(self, key: Key) -> Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: Connection(key),
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
        return conn

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


def encode_request(request: UpstreamRequest, key: Key, target: str) -> bytes:
    """The request head and body. A header with CR, LF or NUL is refused (no header injection): like
    aiohttp's client, the request fails before anything is sent (a failure of this worker, retried)."""
    scheme, host, port = key
    default = 443 if scheme == "https" else 80
    authority = host if port == default else f"{host}:{port}"
    if ":" in host:
        authority = f"[{host}]" if port == default else f"[{host}]:{port}"
    lines = [f"{request.method} {target} HTTP/1.1", f"Host: {authority}"]
    lines += [f"{k}: {v}" for k, v in request.headers.items()]
    if any(not _safe(line) for line in lines):
        raise UpstreamError(FailureKind.CONNECT, UNENCODABLE)
    if request.body or request.method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(request.body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + request.body


def _safe(text: str) -> bool:
    return "\r" not in text and "\n" not in text and "\0" not in text
