"""``client_session``: the one aiohttp client session factory (upstream, fetcher, benchmark)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from prefix_router.pool.http import AiohttpFetcher, FetchError, client_session


def cookie_app(seen: list[str | None]) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Cookie"))
        response = web.Response(text="x" * 100)
        response.set_cookie("engine-session", "secret")
        return response

    app = web.Application()
    app.router.add_get("/page", handle)
    return app


async def test_sessions_keep_no_cookie(serve_app: Any) -> None:
    seen: list[str | None] = []
    running = await serve_app(cookie_app(seen))
    async with client_session(aiohttp.ClientTimeout(total=5)) as session:
        for _ in range(2):
            async with session.get(running.url + "/page") as resp:
                assert resp.status == 200 and "engine-session" in resp.cookies
    assert seen == [None, None]


async def test_connections_are_bounded(serve_app: Any) -> None:
    release = asyncio.Event()

    async def hold(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"started")
        await release.wait()  # the body never ends while the test holds it: the connection stays busy
        return response

    app = web.Application()
    app.router.add_get("/hold", hold)
    running = await serve_app(app)
    async with client_session(aiohttp.ClientTimeout(total=5), connections=2) as session:
        held = [await session.get(running.url + "/hold") for _ in range(2)]
        try:
            with pytest.raises(TimeoutError):
                await session.get(running.url + "/hold", timeout=aiohttp.ClientTimeout(total=0.3))
        finally:
            release.set()
            for resp in held:
                resp.close()


async def test_the_fetcher_bounds_bodies_and_keeps_no_cookie(serve_app: Any) -> None:
    seen: list[str | None] = []
    running = await serve_app(cookie_app(seen))
    fetcher = AiohttpFetcher()
    try:
        assert (await fetcher.get(running.url + "/page", {}, 5.0, 1000)).body == b"x" * 100
        try:
            await fetcher.get(running.url + "/page", {}, 5.0, 10)
            raise AssertionError("an oversize body was accepted")
        except FetchError as exc:
            assert "over 10 bytes" in str(exc)
    finally:
        await fetcher.close()
    assert seen == [None, None]
