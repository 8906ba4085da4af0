"""How a served router's requests reach its app (``node.life.server``): ``Dispatch`` remembers the routes of
plain paths and answers from them as the app's own resolution would (aiohttp's connection handler:
``http_server: aiohttp``; with the router's own, ``tests/proxy/run/test_lean.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from prefix_router.node.life.server import Dispatch, Running, start
from support.routers import RouterHandle

NAME = web.AppKey("name", str)
AIOHTTP = {"http_server": "aiohttp"}  # every request through aiohttp's connection handler
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'


def dispatch_of(running: Running) -> Dispatch:
    server = running.runner.server
    assert server is not None and isinstance(server.request_handler, Dispatch)
    return server.request_handler


async def post(url: str, path: str, method: str = "POST", **kwargs: Any) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as http, http.request(method, url + path, **kwargs) as response:
        return response.status, await response.read()


async def test_a_plain_route_is_remembered_and_answers_as_resolved(
    fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("a", reply="fine")
    router: RouterHandle = await start_router(engine, settings=AIOHTTP)
    dispatch = dispatch_of(router.running)
    answers = [await post(router.url, "/v1/chat/completions", data=BODY) for _ in range(3)]
    assert len(dispatch) == 1  # the first request resolved it; the next two came through the memory
    assert [status for status, _ in answers] == [200, 200, 200]
    assert all(b'"fine"' in body for _, body in answers)
    assert len(engine.generations) == 3


async def test_what_is_not_a_plain_route_under_its_method_is_resolved_each_time(
    fake_engine: Any, start_router: Any
) -> None:
    router: RouterHandle = await start_router(await fake_engine("a"), settings=AIOHTTP)
    dispatch = dispatch_of(router.running)
    for _ in range(2):
        assert (await post(router.url, "/v1/chat/completions", method="GET"))[0] == 405  # a "*" route
        assert (await post(router.url, "/nowhere"))[0] == 404  # the catch-all, a pattern
        assert (await post(router.url, "/v1/embeddings", data=BODY))[0] == 200  # /v1/{tail}: a pattern
    assert len(dispatch) == 0
    assert (await post(router.url, "/v1/completions", method="PUT"))[0] == 405  # under another method
    assert len(dispatch) == 0


async def handled(request: web.Request) -> web.Response:
    return web.Response(text=f"{request.app[NAME]} {request.match_info.route.name}")


async def serve_plain(paths: int) -> tuple[Running, list[str]]:
    app = web.Application()
    app[NAME] = "app"
    names = [f"/p{i}" for i in range(paths)]
    for i, path in enumerate(names):
        app.router.add_post(path, handled, name=f"route{i}")
    return await start(app), names


async def test_the_memory_holds_at_most_its_limit_and_the_rest_still_answers() -> None:
    running, paths = await serve_plain(6)
    try:
        dispatch = dispatch_of(running)
        dispatch._limit = 3
        for _ in range(2):
            for i, path in enumerate(paths):
                assert await post(running.url, path) == (200, f"app route{i}".encode())
        assert len(dispatch) == 3
    finally:
        await running.stop()


async def test_expect_100_continue_on_a_remembered_route_is_still_answered_first() -> None:
    running, paths = await serve_plain(1)
    try:
        assert await post(running.url, paths[0]) == (200, b"app route0")
        assert len(dispatch_of(running)) == 1
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        head = f"POST {paths[0]} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
        writer.write(head.encode())
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert interim.startswith(b"HTTP/1.1 100 Continue")
        writer.write(b"{}")
        final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert final.startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        await running.stop()
