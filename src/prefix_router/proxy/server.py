"""Running a router app: always with handler cancellation (a client disconnect cancels its handler,
which aborts the upstream request), no access log on the hot path, the router's own connection handler
(errors outside the app in the OpenAI shape, see ``http_errors``), and the event loop chosen by config."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from prefix_router.proxy.http_errors import HANDLER_LIMITS, OpenAIServer

SHUTDOWN_TIMEOUT_S = 30.0
# a client connection must send a complete request head within this long of opening (or of the previous
# response): aiohttp closes it otherwise, which is what cuts slowloris-style slow headers
KEEPALIVE_TIMEOUT_S = 60.0


class ProxyRunner(web.AppRunner):
    """aiohttp's application runner, serving connections with ``OpenAIRequestHandler`` and its limits."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        super().__init__(app, handler_cancellation=True, access_log=None, **HANDLER_LIMITS, **kwargs)

    async def _make_server(self) -> web.Server:
        # aiohttp builds its Server in this (internal) step, with no way to pass a handler class: the
        # server it built is made an OpenAIServer, which differs only by the handler it creates
        server = await super()._make_server()
        server.__class__ = OpenAIServer
        return server


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
    runner = ProxyRunner(app, shutdown_timeout=shutdown_timeout, keepalive_timeout=keepalive_timeout)
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


def run(
    app: web.Application,
    host: str,
    port: int,
    event_loop: str,
    log_level: str = "info",
    shutdown_timeout: float = SHUTDOWN_TIMEOUT_S,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT_S,
) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting and let in-flight requests finish (bounded).
    What ``web.run_app`` does, with ``ProxyRunner`` (``run_app`` cannot take another runner)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_gc()
    loop = loop_factory(event_loop)()
    asyncio.set_event_loop(loop)
    main = loop.create_task(_serve(app, host, port, shutdown_timeout, keepalive_timeout))
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        main.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(main)  # the runner's cleanup: drain, then the app's cleanup
        _cancel_all(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _serve(
    app: web.Application, host: str, port: int, shutdown_timeout: float, keepalive_timeout: float
) -> None:
    runner = ProxyRunner(
        app, handle_signals=True, shutdown_timeout=shutdown_timeout, keepalive_timeout=keepalive_timeout
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, backlog=2048).start()
        logging.getLogger("prefix_router").info("serving on http://%s:%d", host, port)
        await asyncio.Event().wait()  # until a signal raises GracefulExit
    finally:
        await runner.cleanup()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
