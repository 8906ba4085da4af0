"""Running a router app: always with handler cancellation (a client disconnect cancels its handler,
which aborts the upstream request), no access log on the hot path, and the event loop chosen by config."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

SHUTDOWN_TIMEOUT_S = 30.0
# a client connection must send a complete request head within this long of opening (or of the previous
# response): aiohttp closes it otherwise, which is what cuts slowloris-style slow headers
KEEPALIVE_TIMEOUT_S = 60.0


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
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=keepalive_timeout,
    )
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
    reuse_port: bool = False,
) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting and let in-flight requests finish (bounded).
    ``reuse_port``: share the port with the other processes of ``serve --processes`` (``SO_REUSEPORT``)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_gc()
    loop = loop_factory(event_loop)()
    asyncio.set_event_loop(loop)
    web.run_app(
        app,
        host=host,
        port=port,
        loop=loop,
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=keepalive_timeout,
        reuse_port=reuse_port or None,
        print=lambda msg: logging.getLogger("prefix_router").info("%s", msg),
    )
