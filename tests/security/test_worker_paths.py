"""What an engine's answer and a client's path may reveal or bypass, under both connection handlers
(``http_server``): a redirect of the engine's that names the worker's address reaches the client relative to
the router (a FastAPI engine answers ``POST /v1/chat/completions/`` with a 307 to its own URL); a path that
decodes to a generation endpoint (``/v1/chat%2Fcompletions``) is refused, never passed through unrouted
(the engine would run it as that endpoint, without the router's routing or the tenant's ``cache_salt``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from support.kits import SecurityKit

SERVERS = ["lean", "aiohttp"]


def redirecting_engine(hits: list[str]) -> web.Application:
    """A FastAPI-like engine: a trailing slash is redirected to its own absolute URL."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def other(request: web.Request) -> web.Response:
        if request.path.startswith("/v1"):
            hits.append(request.raw_path)
        if request.path.endswith("/"):
            location = f"http://{request.host}{request.path.rstrip('/')}"
            return web.Response(status=307, headers={"Location": location, "Content-Location": location})
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/health", models)
    app.router.add_get("/v1/models", models)
    app.router.add_route("*", "/{tail:.*}", other)
    return app


@pytest.fixture(params=SERVERS)
async def router(request: Any, serve_app: Any, start_router: Any) -> Any:
    hits: list[str] = []
    running = await serve_app(redirecting_engine(hits))
    engine = SimpleNamespace(name="w", url=running.url, hits=hits, port=running.port)
    handle = await start_router(engine, settings={"http_server": request.param})
    handle.engine = engine
    return handle


async def test_a_redirect_to_the_worker_is_made_relative_to_the_router(router: Any) -> None:
    async with aiohttp.ClientSession() as http:
        url = router.url + "/v1/chat/completions/"
        async with http.post(url, json=SecurityKit.CHAT, allow_redirects=False) as response:
            status, headers = response.status, response.headers
    assert status == 307
    assert headers["Location"] == "/v1/chat/completions"
    assert headers["Content-Location"] == "/v1/chat/completions"
    assert str(router.engine.port) not in str(headers)


@pytest.mark.parametrize(
    "path", ["/v1/chat%2Fcompletions", "/v1/chat%2fcompletions/", "/v1/%63ompletions", "/v1%2Fcompletions"]
)
async def test_a_path_that_decodes_to_a_generation_endpoint_is_refused(router: Any, path: str) -> None:
    status, _, body = await SecurityKit.post(router.url, path=path)
    assert status in (400, 404), body
    assert not router.engine.hits
    assert SecurityKit.openai_error(body)["type"] == "invalid_request_error"


async def test_an_encoded_slash_elsewhere_still_passes(router: Any) -> None:
    status, _, _ = await SecurityKit.post(router.url, path="/v1/files/org%2Fname")
    assert status == 200 and router.engine.hits == ["/v1/files/org%2Fname"]
