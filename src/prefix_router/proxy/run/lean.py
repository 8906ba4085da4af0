"""The router's own connection handler for its hot path: generation requests read whole by llhttp
(``httptools``) on an ``asyncio`` protocol of its own (a native class when compiled) and answered by the
edge's handlers (``handlers.ROUTED``, through ``handlers.answer``) without aiohttp's request machinery.
Any other request, and a connection that turns unusual, is handed to aiohttp's connection handler with
every byte received of it so far: aiohttp then serves that connection to its end, as if it had from the
start.

Served here (anything else is handed over): ``POST`` to a path of ``handlers.ROUTED`` in origin form,
HTTP/1.1, one ``Host``, one ``Content-Length`` of at most ``limits.max_body_bytes``, no ``Transfer-Encoding``,
``Expect``, ``Upgrade`` or ``Content-Encoding``, ASCII header values, lines within aiohttp's limits
(``http_errors``), the whole message soon after its first byte (``LeanServer.incomplete_s``), one at a time:
bytes that arrive while an answer is being made wait for it (reading pauses past ``HOLD_BYTES``), and a
message that begins in the read that ended another one (pipelining) is handed over. A malformed request
is handed over too: aiohttp's parser refuses it, in the OpenAI error shape (``http_errors``).

Answers: the handlers write the plain ones (``edge.head``); aiohttp's response machinery writes any other
(an error, a status without a body) on a request made for it (``respond``). After an answer the connection
stays open if the client and the answer keep it alive and the router is not stopping. A client that goes
away cancels its request's handler (``serve`` runs aiohttp with handler cancellation too). Idle connections
are closed after the keep-alive timeout (``LeanServer.sweep``), every connection on shutdown.
Measured against aiohttp's connection handler: ``benchmarks/floor.py`` (``floor-protocol`` against
``floor-aiohttp-direct``) and ``bench-overhead``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import httptools
from aiohttp import web
from aiohttp.client_exceptions import ClientConnectionResetError
from aiohttp.http import HttpVersion11
from aiohttp.http_parser import RawRequestMessage
from aiohttp.http_writer import StreamWriter
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.tcp_helpers import tcp_nodelay
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from prefix_router.node import MAX_HEADER_BYTES, MAX_HEADERS, MAX_URL_BYTES, STATE, NodeState
from prefix_router.proxy.edge.handlers import GUARDED, ROUTED, NotedHandler, answer
from prefix_router.proxy.edge.request import WholeRequest

log = logging.getLogger(__name__)
# a message not whole this long after its first byte (a slow client, a long body on a slow link) goes to
# aiohttp, whose timeouts then apply: at most this long later than they would, and at most a quarter of
# ``timeouts.client_header_s`` and ``client_body_s`` (``LeanServer.incomplete_s``)
INCOMPLETE_S = 1.0
HOLD_BYTES = 1 << 20  # bytes held while an answer is being made, before reading pauses
SWEEP_S = 5.0  # how often idle connections are looked for (at most: twice per keep-alive timeout)
HANDED_OVER = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"content-encoding"})


class HandOver(Exception):
    """Not a message this handler serves: aiohttp takes the connection."""


@dataclass(slots=True)
class Message:
    target: bytes = b""
    path: bytes = b""  # the target without its query: the route
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    lengths: list[bytes] = field(default_factory=list)  # its Content-Length values
    hosts: int = 0  # how many Host headers
    body: list[bytes] = field(default_factory=list)
    handler: NotedHandler | None = None
    keep_alive: bool = True


class LeanServer:
    """The connections of one listening server: the protocol factory (``__call__``), the idle sweep and
    shutdown. ``fallback`` makes aiohttp's connection handler; ``routes``: ``handlers.ROUTED``'s handlers
    that the app serves at those paths (``lean_routes``)."""

    def __init__(
        self,
        state: NodeState,
        routes: dict[bytes, NotedHandler],
        fallback: Callable[[], asyncio.Protocol],
        keepalive_timeout: float,
    ) -> None:
        self.state = state
        self.routes = routes
        self.fallback = fallback
        self.keepalive_timeout = keepalive_timeout
        self.max_body = state.config.limits.max_body_bytes
        timeouts = state.config.timeouts
        self.incomplete_s = min(INCOMPLETE_S, timeouts.client_header_s / 4, timeouts.client_body_s / 4)
        self.loop = asyncio.get_running_loop()
        self.connections: set[LeanConnection] = set()
        self.closing = False
        self._sweeper = self.loop.create_task(self.sweep())

    def __call__(self) -> asyncio.Protocol:
        connection: Any = LeanConnection(self)  # an ``asyncio.Protocol`` by its methods
        return connection  # type: ignore[no-any-return]

    async def sweep(self) -> None:
        """Close the connections idle for longer than the keep-alive timeout, every ``SWEEP_S``."""
        while True:
            await asyncio.sleep(min(SWEEP_S, self.keepalive_timeout / 2))
            now = self.loop.time()
            for connection in list(self.connections):
                if connection.idle() and now - connection.idle_since > self.keepalive_timeout:
                    connection.close()

    def pre_shutdown(self) -> None:
        """No new answers on kept-alive connections: idle ones close now, busy ones after their answer."""
        self.closing = True
        for connection in list(self.connections):
            if connection.idle():
                connection.close()

    async def shutdown(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` for the answers being made, then cancel them; close every connection."""
        self._sweeper.cancel()
        busy = [c.task for c in self.connections if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=timeout)
        for connection in list(self.connections):
            connection.close()
        for task in busy:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sweeper


def lean_routes(app: web.Application) -> dict[bytes, NotedHandler]:
    """The paths of ``handlers.ROUTED`` whose ``POST`` route in ``app`` is the router's own handler (and
    an app without middlewares): an app of another kind gets none."""
    if app.middlewares:
        return {}
    found: dict[bytes, NotedHandler] = {}
    for resource in app.router.resources():
        info = resource.get_info()
        path = info.get("path")
        if path not in ROUTED:
            continue
        for route in resource:
            if route.method == "POST" and route.handler is GUARDED[path]:
                found[path.encode()] = ROUTED[path]
    return found


def front_door(
    app: web.Application, fallback: Callable[[], asyncio.Protocol], keepalive_timeout: float
) -> LeanServer | None:
    """The proxy's app's front door (``node.life.server.FRONT``): a ``LeanServer`` for its generation
    routes under ``http_server: lean``, else None (aiohttp's connection handler serves alone)."""
    state = app[STATE]
    routes = lean_routes(app) if state.config.http_server == "lean" else {}
    return LeanServer(state, routes, fallback, keepalive_timeout) if routes else None


class LeanConnection:
    """One client connection (see the module doc): an ``asyncio.Protocol`` by its methods, and what
    aiohttp's writer asks of its ``BaseProtocol`` (``transport``, ``_paused``, ``_drain_helper``), not by
    their bases, so that the compiled build makes it a native class (its attributes read without a
    dictionary lookup)."""

    def __init__(self, server: LeanServer) -> None:
        self._loop = server.loop
        self.transport: asyncio.Transport | None = None
        self._paused = False  # writing, by the transport's flow control
        self._drain_waiter: asyncio.Future[None] | None = None
        self._server = server
        self._request_parser = httptools.HttpRequestParser(self)
        self._raw: list[bytes] = []  # the bytes of the message in progress, as received
        self._held: list[bytes] = []  # bytes received while an answer is being made
        self._held_bytes = 0
        self._holding = False  # reading paused for them
        self._message: Message | None = None
        self._whole: Message | None = None  # the message that ended in the current read
        self._timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None
        self.idle_since = server.loop.time()
        self._handed = False

    # ---------------------------------------------------------------- transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        tcp_nodelay(self.transport, True)
        self._server.connections.add(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self._wake_drain(exc)
        self._server.connections.discard(self)
        self._cancel_timer()
        if self.task is not None:
            self.task.cancel()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drain(None)

    def _wake_drain(self, exc: BaseException | None) -> None:
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is None or waiter.done():
            return
        if exc is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(ConnectionError("Connection lost"))

    async def _drain_helper(self) -> None:
        """Until the transport takes more bytes (aiohttp's writer calls it, ``drain`` too)."""
        if self.transport is None:
            raise ClientConnectionResetError("Connection lost")
        if not self._paused:
            return
        waiter = self._drain_waiter
        if waiter is None:
            waiter = self._drain_waiter = self._loop.create_future()
        await waiter

    def data_received(self, data: bytes) -> None:
        if self.task is not None:  # an answer is being made: the bytes wait for it
            self._held.append(data)
            self._held_bytes += len(data)
            if self._held_bytes > HOLD_BYTES and not self._holding and self.transport is not None:
                self._holding = True
                self.transport.pause_reading()
            return
        self._read(data)

    def _read(self, data: bytes) -> None:
        self._raw.append(data)
        try:
            self._request_parser.feed_data(data)
        except httptools.HttpParserError:  # malformed, or a callback's HandOver
            self._hand_over()
            return
        whole, self._whole = self._whole, None
        if whole is not None:
            self._raw = []
            self._cancel_timer()
            self.task = self._loop.create_task(self._serve(whole))
        elif self._message is None:
            self._raw = []  # only the blank lines llhttp skips between messages
        elif self._timer is None:
            self._timer = self._loop.call_later(self._server.incomplete_s, self._hand_over)

    def idle(self) -> bool:
        return self.task is None and self._message is None and not self._handed

    def close(self) -> None:
        if self.transport is not None and not self._handed:
            self.transport.close()

    # ---------------------------------------------------------------- parser callbacks

    def on_message_begin(self) -> None:
        if self._whole is not None:
            raise HandOver("pipelined")
        self._message = Message()

    def on_url(self, url: bytes) -> None:
        message = self._current()
        message.target += url
        if len(message.target) > MAX_URL_BYTES:
            raise HandOver("target")

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self._current()
        message.headers.append((name, value))
        if len(message.headers) > MAX_HEADERS or len(name) + len(value) + 2 > MAX_HEADER_BYTES:
            raise HandOver("headers")
        if not value.isascii():
            raise HandOver("header value")
        lower = name.lower()
        if lower == b"content-length":
            message.lengths.append(value)
        elif lower == b"host":
            message.hosts += 1
        elif lower in HANDED_OVER:
            raise HandOver("header")

    def on_headers_complete(self) -> None:
        message, parser = self._current(), self._request_parser
        if parser.get_method() != b"POST" or parser.get_http_version() != "1.1" or parser.should_upgrade():
            raise HandOver("method")
        target = message.target
        message.path = target.split(b"?", 1)[0]
        handler = self._server.routes.get(message.path)
        if handler is None or not target.startswith(b"/") or not target.isascii():
            raise HandOver("route")
        if message.hosts != 1:  # aiohttp's parser refuses it (400)
            raise HandOver("host")
        lengths = message.lengths
        if len(lengths) != 1 or not lengths[0].isdigit() or int(lengths[0]) > self._server.max_body:
            raise HandOver("length")
        message.handler, message.keep_alive = handler, parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._current().body.append(body)

    def on_message_complete(self) -> None:
        self._whole, self._message = self._message, None

    def _current(self) -> Message:
        message = self._message
        if message is None:
            raise HandOver("no message")
        return message

    # ---------------------------------------------------------------- answering

    async def _serve(self, message: Message) -> None:
        keep = False
        try:
            request = self._request(message)
            assert message.handler is not None
            response = await answer(request, message.handler)
            if not response.prepared:  # not written by the handlers: aiohttp writes it
                await self.respond(request, response)
                await response.write_eof()
            stopping = self._server.closing or self._server.state.deadlines.stopping
            keep = bool(response.keep_alive) and not stopping
        except ConnectionError:  # the client left while its answer was written
            log.debug("client gone while answering")
        except Exception:  # the handlers answer their own errors: this is a bug of this module's
            log.exception("unexpected error answering a request")
        finally:
            self.task = None
        if not keep or self.transport is None:
            self.close()
            return
        self.idle_since = self._loop.time()
        if self._held:
            data, self._held, self._held_bytes = b"".join(self._held), [], 0
            if self._holding:
                self._holding = False
                self.transport.resume_reading()
            self._read(data)

    def _request(self, message: Message) -> WholeRequest:
        headers = CIMultiDictProxy(CIMultiDict((n.decode(), v.decode()) for n, v in message.headers))
        path, target, body = message.path.decode(), message.target.decode(), b"".join(message.body)
        return WholeRequest(self._server.state, "POST", path, target, headers, message.keep_alive, body, self)

    async def drain(self) -> None:
        await self._drain_helper()

    async def respond(self, request: WholeRequest, response: web.StreamResponse) -> None:
        """Start ``response`` with aiohttp's machinery, on an aiohttp request made for it."""
        url = URL(request.target, encoded=True)
        message: Any = RawRequestMessage  # aiohttp's C class where its parser is built: not a tuple
        raw = message(
            request.method, request.target, HttpVersion11, request.headers, (), not request.keep_alive,
            None, False, False, url,
        )  # fmt: skip
        protocol: Any = self  # duck-typed: aiohttp's BaseProtocol and RequestHandler by what they use
        writer = StreamWriter(protocol, self._loop)
        made = web.Request(raw, EMPTY_PAYLOAD, protocol, writer, asyncio.current_task(), self._loop)  # type: ignore[arg-type]
        await response.prepare(made)

    # what aiohttp's request asks of its connection (``respond``)
    ssl_context: Any = None

    @property
    def peername(self) -> Any:
        return None if self.transport is None else self.transport.get_extra_info("peername")

    @property
    def sockname(self) -> Any:
        return None if self.transport is None else self.transport.get_extra_info("sockname")

    # ---------------------------------------------------------------- handing over

    def _hand_over(self) -> None:
        """aiohttp's connection handler takes the connection, with what was received of it so far."""
        if self._handed or self.transport is None or self.task is not None:
            return
        self._handed = True
        self._cancel_timer()
        self._server.connections.discard(self)
        transport, handler = self.transport, self._server.fallback()
        data = b"".join(self._raw + self._held)
        self._raw, self._held = [], []
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._holding:
            self._holding = False
            transport.resume_reading()
        if data:
            handler.data_received(data)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
