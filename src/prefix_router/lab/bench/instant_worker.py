"""An engine that answers at once: the yardstick of ``prefix-router bench-overhead``.

``python -m prefix_router.lab.bench.instant_worker --port P`` serves ``/v1/chat/completions`` and
``/v1/completions`` (a fixed short reply; streams of ``--chunks`` SSE events), ``/v1/models`` and
``/health`` (and the ``/server_info``, ``/model_info`` that sglang-router asks), with no work at all,
so that any latency seen through the router is the router's. Its listen backlog is the router's (2048):
with aiohttp's default (128), a proxy opening a few hundred upstream connections at once overflowed it,
and the dropped SYNs came back a second later (TCP's retransmission), a 1 s tail that was the worker's.
"""

from __future__ import annotations

import argparse
import asyncio

import orjson
from aiohttp import web

from prefix_router.node import loop_factory

MODEL = "instant"
BACKLOG = 2048  # as the router's server (node/life/server.py)
_USAGE = {"prompt_tokens": 100, "completion_tokens": 8, "total_tokens": 108}


def _whole(chat: bool) -> bytes:
    if chat:
        choice: dict[str, object] = {
            "index": 0,
            "message": {"role": "assistant", "content": "ok"},
            "finish_reason": "stop",
        }
    else:
        choice = {"index": 0, "text": "ok", "finish_reason": "stop"}
    return orjson.dumps(
        {"id": "i", "object": "x", "created": 0, "model": MODEL, "choices": [choice], "usage": _USAGE}
    )


def _event(chat: bool) -> bytes:
    choice = {"index": 0, "delta": {"content": "tok"}} if chat else {"index": 0, "text": "tok"}
    return (
        b"data: "
        + orjson.dumps({"id": "i", "object": "x", "created": 0, "model": MODEL, "choices": [choice]})
        + b"\n\n"
    )


def build_app(chunks: int) -> web.Application:
    bodies = {True: _whole(True), False: _whole(False)}
    events = {True: _event(True), False: _event(False)}

    async def generate(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        chat = request.path.endswith("chat/completions")
        if not body.get("stream"):
            return web.Response(body=bodies[chat], content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(chunks):
            await resp.write(events[chat])
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}
        )

    async def health(request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def info(request: web.Request) -> web.StreamResponse:  # what sglang-router asks at start-up
        return web.json_response({"served_model_name": MODEL, "is_generation": True})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/completions", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
        app.router.add_get(path, info)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--event-loop", default="uvloop", choices=["uvloop", "asyncio"])
    parser.add_argument("--backlog", type=int, default=BACKLOG, help="listen backlog (connections)")
    args = parser.parse_args()
    loop = loop_factory(args.event_loop)()
    asyncio.set_event_loop(loop)
    web.run_app(
        build_app(args.chunks),
        host="127.0.0.1",
        port=args.port,
        loop=loop,
        access_log=None,
        print=None,
        backlog=args.backlog,
    )


if __name__ == "__main__":
    main()
