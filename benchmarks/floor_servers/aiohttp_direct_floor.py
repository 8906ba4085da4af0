"""Floor server for ``benchmarks/floor.py``: aiohttp's server as prefix-router drives it, around a handler
that forwards and does nothing else. Served as ``serve`` serves its app (``prefix_router.node.run_app``:
the sockets it binds, its runner with the router's connection handler and ``Dispatch``, which calls a
plain route's handler without resolving it again, the collector's tuning), one plain route
(``POST /v1/chat/completions``), the body read, forwarded to one worker through the project's upstream
client and the answer written as the router writes its own (``floor_common.answer_as_router``:
``edge.head``, no ``web.Response``). What aiohttp costs prefix-router, without the router's own work: a
measuring instrument, not product code.

    python benchmarks/floor_servers/aiohttp_direct_floor.py --port 8001 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

from aiohttp import web
from floor_common import answer_as_router, arguments

from prefix_router.node import HttpUpstream, run_app


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


def main() -> None:
    args = arguments(__doc__)
    run_app(build_app(args.upstream), "127.0.0.1", args.port, "uvloop", reuse_port=args.reuse_port)


if __name__ == "__main__":
    main()
