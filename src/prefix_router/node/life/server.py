"""Running a node's app: always with handler cancellation (a client disconnect cancels its handler,
which aborts the upstream request), without aiohttp's access log (the node writes its own, see
``node.request.access``), with aiohttp's connection handler made to answer errors outside the app in the
OpenAI shape (``control.http_errors``) and, where the app names one (``FRONT``: the proxy's ``lean`` for
``http_server: lean``), another connection handler in front of it, and the event loop chosen by config.
``run`` binds the address before anything starts (a port in use is one line, ``ListenError``), keeps the
listener open while it drains on SIGTERM, and reloads on SIGHUP (``Hooks``)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web
from aiohttp.web_urldispatcher import PlainResource, UrlMappingMatchInfo

from prefix_router.node.control.http_errors import HANDLER_LIMITS, Connections, OpenAIServer

SHUTDOWN_TIMEOUT_S = 30.0
# a client connection must send a complete request head within this long of opening (or of the previous
# response): aiohttp closes it otherwise, which is what cuts slowloris-style slow headers
KEEPALIVE_TIMEOUT_S = 60.0
AFTER_SHUTDOWN_S = 1.0
MAX_DIRECT = 64  # request targets whose route ``Dispatch`` remembers
log = logging.getLogger("prefix_router")
# the connection handler an app puts in front of aiohttp's (given the app, the factory of aiohttp's
# handlers it hands connections to, and the keep-alive timeout), or None for that app as it is configured
FrontDoor = Callable[[web.Application, Callable[[], asyncio.Protocol], float], Connections | None]
FRONT = web.AppKey[FrontDoor]("prefix_router_front")


class NodeRunner(web.AppRunner):
    """aiohttp's application runner, serving connections with ``OpenAIRequestHandler`` and its limits,
    without aiohttp's decoding of request bodies (the router decodes them with a bound: ``edge.decoding``)."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        super().__init__(
            app, handler_cancellation=True, access_log=None, auto_decompress=False, **HANDLER_LIMITS, **kwargs
        )

    async def _make_server(self) -> web.Server:
        # aiohttp builds its Server in this (internal) step, with no way to pass a handler class: the
        # server it built is made an OpenAIServer, which differs only by the handlers it creates; its
        # requests go to the app through ``Dispatch``; an app that names a front door (``FRONT``) has it
        # serve connections first
        server = await super()._make_server()
        server.__class__ = OpenAIServer
        assert isinstance(server, OpenAIServer)
        server.request_handler = Dispatch(self.app)
        front = self.app.get(FRONT)
        if front is not None:
            keepalive = float(self._kwargs.get("keepalive_timeout", KEEPALIVE_TIMEOUT_S))
            server.lean = front(self.app, server.handler, keepalive)
        return server


class Dispatch:
    """What aiohttp's server calls with each request: the app's own handler (``Application._handle``:
    the route resolved, then its handler called), except for a request whose method and request target
    resolved before to a route of a plain path under that very method (``POST /v1/chat/completions``):
    that route's handler is called at once with the match resolved then (the same route for the same
    target: the app's routes are frozen once it serves). Remembered: at most ``limit`` targets. Not for a
    request with ``Expect`` (the app answers it first), nor for an app with middlewares. Saves the route
    resolution, about 3 us of a request's CPU."""

    def __init__(self, app: web.Application, limit: int = MAX_DIRECT) -> None:
        self._app = app
        self._limit = 0 if app.middlewares else limit
        self._known: dict[tuple[str, str], UrlMappingMatchInfo] = {}

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        key = (request.method, request.raw_path)
        info = self._known.get(key)
        if info is None or hdrs.EXPECT in request.headers:
            response = await self._app._handle(request)  # type: ignore[arg-type]
            if info is None and len(self._known) < self._limit:
                self._learn(key, request)
            return response
        request._match_info = info  # type: ignore[attr-defined]  # what Application._handle sets
        return await info.handler(request)  # type: ignore[arg-type]  # the app makes web.Request

    def _learn(self, key: tuple[str, str], request: web.BaseRequest) -> None:
        info = getattr(request, "_match_info", None)
        route = getattr(info, "route", None)
        if (
            isinstance(info, UrlMappingMatchInfo)
            and not info  # no match variables
            and route is not None
            and isinstance(route.resource, PlainResource)
            and route.method == key[0]
            and info.apps == (self._app,)
        ):
            self._known[key] = info

    def __len__(self) -> int:
        return len(self._known)


@dataclass(slots=True)
class Running:
    runner: web.AppRunner
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT_S,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT_S,
) -> Running:
    """Start serving ``app`` on ``host:port`` (0: any free port) inside the running loop."""
    runner = NodeRunner(app, shutdown_timeout=shutdown_timeout, keepalive_timeout=keepalive_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    address = runner.addresses[0]
    return Running(runner, int(address[1]))


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """``uvloop`` (measured faster by ``bench-overhead``) unless ``asyncio`` is asked for or it is missing."""
    if choice != "asyncio":
        try:
            import uvloop

            factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
            return factory
        except ImportError:
            if choice == "uvloop":
                raise
    return asyncio.new_event_loop


def tune_gc() -> None:
    """Fewer, cheaper collections: the prefix index holds many long-lived objects that every full
    collection would walk (bench-overhead measured a few tens of microseconds per request saved)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


class ListenError(OSError):
    """The listening address cannot be bound (in use, not permitted, not resolvable): one line."""


def bind(host: str, port: int, reuse_port: bool = False) -> list[socket.socket]:
    """Bound (not yet listening) sockets for every address ``host`` resolves to, as asyncio would make
    them; fails before anything starts, with one line. ``reuse_port``: shared with the other processes of
    ``serve --processes`` (``SO_REUSEPORT``: the kernel spreads new connections across them)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {(exc.strerror or str(exc)).lower()}") from None
    return sockets


class EarlyHangup:
    """Made first thing in a serving process: a SIGHUP before the server's own handler is installed is
    remembered (``serve`` reloads once serving) instead of ending the process (SIGHUP's default)."""

    def __init__(self) -> None:
        self.pending = False
        signal.signal(signal.SIGHUP, self._hangup)

    def _hangup(self, signum: int, frame: object) -> None:
        self.pending = True


@dataclass(slots=True)
class Hooks:
    """What the serving process does around the server: ``serving`` once it listens (with its addresses),
    ``shutdown`` on SIGTERM/SIGINT before the listener closes, ``reload`` on SIGHUP."""

    serving: Callable[[list[str]], None] = lambda addresses: None
    shutdown: Callable[[], Coroutine[Any, Any, None]] | None = None
    reload: Callable[[], Coroutine[Any, Any, None]] | None = None
    early: EarlyHangup | None = None


def run(
    app: web.Application,
    host: str,
    port: int,
    event_loop: str,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT_S,
    hooks: Hooks | None = None,
    reuse_port: bool = False,
) -> None:
    """Serve until SIGTERM/SIGINT, then ``hooks.shutdown`` with the listener still open, then close.
    SIGHUP runs ``hooks.reload`` (never ends the process). Raises ``ListenError`` when the address cannot
    be bound (before the app starts). ``reuse_port``: see ``bind``."""
    tune_gc()
    loop = loop_factory(event_loop)()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve(app, host, port, keepalive_timeout, hooks or Hooks(), reuse_port))
    finally:
        _cancel_all(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def serve(
    app: web.Application,
    host: str,
    port: int,
    keepalive_timeout: float,
    hooks: Hooks,
    reuse_port: bool = False,
) -> None:
    sockets = bind(host, port, reuse_port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    _signals(loop, stop, hooks)
    runner = NodeRunner(
        app,
        shutdown_timeout=AFTER_SHUTDOWN_S,  # the graceful shutdown waited already: the rest is cancelled
        keepalive_timeout=keepalive_timeout,
    )
    try:
        await runner.setup()
        for sock in sockets:
            await web.SockSite(runner, sock, backlog=2048).start()
        hooks.serving([_url(address) for address in runner.addresses])
        await stop.wait()
        if hooks.shutdown is not None:
            await hooks.shutdown()
    finally:
        await runner.cleanup()
        for sock in sockets:
            sock.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)


def _signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, hooks: Hooks) -> None:
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    reloader = Reloader(loop, hooks.reload)
    loop.add_signal_handler(signal.SIGHUP, reloader.signal)
    if hooks.early is not None and hooks.early.pending:
        reloader.signal()


class Reloader:
    """Runs ``reload`` on SIGHUP, one at a time: a SIGHUP during a reload runs one more after it (the file
    may have changed after it was read); a failing reload is logged, never fatal."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, reload: Callable[[], Coroutine[Any, Any, None]] | None
    ) -> None:
        self._loop, self._reload = loop, reload
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def signal(self) -> None:
        if self._reload is None:
            log.info("SIGHUP: nothing to reload")
        elif self._task is not None:
            self._again = True
        else:
            self._task = self._loop.create_task(self._run(self._reload))

    async def _run(self, reload: Callable[[], Coroutine[Any, Any, None]]) -> None:
        try:
            while True:
                self._again = False
                try:
                    await reload()
                except Exception:
                    log.exception("SIGHUP: the reload failed; the configuration in use stays")
                if not self._again:
                    return
        finally:
            self._task = None


def _url(address: Any) -> str:
    host, port = address[0], address[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
