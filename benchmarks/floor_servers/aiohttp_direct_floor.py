"""Floor server for ``benchmarks/floor.py``: aiohttp's server as prefix-router drives it, around a handler
that forwards and does nothing else. ``serve``'s own runner (``node.life.server.NodeRunner``: the
router's connection handler, and ``Dispatch``, which calls a plain route's handler without resolving it
again), one plain route (``POST /v1/chat/completions``), the body read, forwarded to one worker through
the project's upstream client and the answer written as the router writes its own
(``floor_common.answer_as_router``: ``edge.head``, no ``web.Response``). What aiohttp costs prefix-router,
without the router's own work: a measuring instrument, not product code.

    python benchmarks/floor_servers/aiohttp_direct_floor.py --port 8001 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from floor_common import answer_as_router, run

from prefix_router.node import HttpUpstream
from prefix_router.node.life.server import NodeRunner


def build_app(base: str) -> web.Application:
    upstream = HttpUpstream(connect_timeout_s=5.0)

    async def handle(request: web.Request) -> web.StreamResponse:
        return await answer_as_router(upstream, base, request, await request.read())

    async def close(app: web.Application) -> None:
        await upstream.close()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    app.on_cleanup.append(close)
    return app


async def serve(port: int, base: str, reuse_port: bool) -> None:
    runner = NodeRunner(build_app(base))
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port, backlog=2048, reuse_port=reuse_port).start()
        await asyncio.Event().wait()  # until the process is stopped
    finally:
        await runner.cleanup()


def main() -> None:
    run(__doc__, serve)


if __name__ == "__main__":
    main()
