"""Floor server for ``benchmarks/floor.py``: aiohttp's web server (the one prefix-router ships on) around
a handler that reads the body, forwards it to one worker through the project's upstream client
(``node.upstream.http_client.HttpUpstream``, the ``Upstream`` seam) and relays the answer: a
``Content-Length`` answer whole, any other one as chunks as they arrive. No routing, no JSON, no logging
(aiohttp's access log off), no metrics, on uvloop: a measuring instrument, not product code.

    python benchmarks/floor_servers/aiohttp_floor.py --port 8001 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import uvloop
from aiohttp import web
from floor_common import BAD_GATEWAY, arguments, forward, read_whole

from prefix_router.node import HttpUpstream, UpstreamRequest, UpstreamResponse


def build_app(base: str) -> web.Application:
    upstream = HttpUpstream(connect_timeout_s=5.0)

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        content_type = request.headers.get("Content-Type", "application/json")
        sent = UpstreamRequest(request.method, base + request.path_qs, {"Content-Type": content_type}, body)
        return await forward(upstream, sent, lambda response: relay(request, response), bad_gateway)

    async def close(app: web.Application) -> None:
        await upstream.close()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_cleanup.append(close)
    return app


async def relay(request: web.Request, response: UpstreamResponse) -> web.StreamResponse:
    headers = {"Content-Type": response.headers.get("Content-Type", "application/octet-stream")}
    if "Content-Length" in response.headers:
        body = await read_whole(response)
        return web.Response(status=response.status, body=body, headers=headers)
    out = web.StreamResponse(status=response.status, headers=headers)
    await out.prepare(request)
    while chunk := await response.next_chunk():
        await out.write(chunk)
    await out.write_eof()
    return out


def bad_gateway() -> web.Response:
    return web.Response(status=502, body=BAD_GATEWAY, headers={"Content-Type": "application/json"})


def main() -> None:
    args = arguments(__doc__)
    loop = uvloop.new_event_loop()
    app = build_app(args.upstream)
    web.run_app(
        app,
        host="127.0.0.1",
        port=args.port,
        loop=loop,
        access_log=None,
        print=None,
        backlog=2048,
        reuse_port=args.reuse_port,
    )


if __name__ == "__main__":
    main()
