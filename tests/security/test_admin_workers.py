"""Workers added through the admin API: URLs checked (port range, numeric port, a host, IPv6 brackets), one
engine under one name only, a new worker pending (not healthy, given no request) until its first probe
passes, and nothing the remote sent echoed back in ``last_error`` (else the admin API is a port and banner
scanner for anyone holding its token)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

TOKEN = "admin-token-for-workers-2b7d"
BANNER = b"SSH-2.0-OpenSSH_9.6p1 banner-7f3a1c internal-build\r\n"
HTML = b"<html><title>intranet wiki page-5d2e</title></html>"
REPLIES = {
    "ssh banner": BANNER,
    "an HTML error page": b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
    % (len(HTML), HTML),
    "garbage status line": b"HTTP/1.1 2x0 " + HTML + b"\r\n\r\n",
}


async def admin(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        data = orjson.dumps(body) if body is not None else None
        async with http.request(method, url + path, headers=headers, data=data) as resp:
            return resp.status, orjson.loads(await resp.read())


@pytest.fixture
async def talker() -> AsyncIterator[Any]:
    """A listener that writes ``talker.reply`` to every connection, then closes it."""

    class Talker:
        reply = b""
        port = 0

    talking = Talker()

    async def speak(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(talking.reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(speak, "127.0.0.1", 0)
    talking.port = int(server.sockets[0].getsockname()[1])
    try:
        yield talking
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("reply", list(REPLIES))
async def test_adding_a_non_engine_echoes_nothing_it_said(
    echo_engine: Any, start_router: Any, talker: Any, reply: str
) -> None:
    talker.reply = REPLIES[reply]
    router = await start_router(await echo_engine("w"), settings={"auth.admin_token": TOKEN})
    status, added = await admin(
        router.url, "POST", "/admin/workers", {"url": f"http://127.0.0.1:{talker.port}"}
    )
    assert status == 201
    worker = added["worker"]
    assert worker["healthy"] is False and worker["health"] == "pending"  # never reported healthy
    assert worker["last_error"]  # something is said about why...
    _, listed = await admin(router.url, "GET", "/admin/workers")
    for blob in (orjson.dumps(added), orjson.dumps(listed)):  # ...but nothing the remote sent
        for leak in (b"SSH", b"banner-7f3a1c", b"intranet", b"page-5d2e", b"Oops"):
            assert leak not in blob, (leak, blob)


async def test_a_new_worker_gets_no_request_before_its_first_probe_passes(
    fake_engine: Any, start_router: Any, kit: Any
) -> None:
    first = await fake_engine("first")
    late = await fake_engine("late", health_status=503, models_status=503)
    settings = {"auth.admin_token": TOKEN, "health.interval_s": 0.1}
    router = await start_router({"url": first.url, "name": "first"}, settings=settings)
    status, added = await admin(router.url, "POST", "/admin/workers", {"url": late.url, "name": "late"})
    assert status == 201 and added["worker"]["health"] == "pending" and not added["worker"]["healthy"]
    for _ in range(6):
        _, headers, _ = await kit.post(router.url, headers={"x-prefix-router-policy": "round_robin"})
        assert headers["x-prefix-router-worker"] == "first"
    assert not late.generations
    late.b.health_status = late.b.models_status = 200
    await kit.wait_until(lambda: router.state.pool.require("late").health.healthy)
    served = set()
    for _ in range(4):
        _, headers, _ = await kit.post(router.url, headers={"x-prefix-router-policy": "round_robin"})
        served.add(headers["x-prefix-router-worker"])
    assert served == {"first", "late"}


BAD_URLS = {
    "http://127.0.0.1:99999": "Port out of range",
    "http://127.0.0.1:abc": "Port could not be cast",
    "http://:8000": "no host",
    "http://[::1": "Invalid IPv6 URL",
    "http://[::1]:0": "1-65535",
    "http://exa mple:80": "without user",
}


@pytest.mark.parametrize("url", list(BAD_URLS))
async def test_malformed_worker_urls_are_refused(echo_engine: Any, start_router: Any, url: str) -> None:
    router = await start_router(await echo_engine("w"), settings={"auth.admin_token": TOKEN})
    status, body = await admin(router.url, "POST", "/admin/workers", {"url": url})
    assert status == 400 and BAD_URLS[url] in body["error"]["message"], body
    assert len(router.state.pool) == 1


async def test_one_engine_under_one_name_only(echo_engine: Any, start_router: Any) -> None:
    engine = await echo_engine("w")
    router = await start_router({"url": engine.url, "name": "w"}, settings={"auth.admin_token": TOKEN})
    port = engine.url.rsplit(":", 1)[1]
    twins = (
        engine.url,
        engine.url + "/",
        f"http://127.0.0.1:{port}/v1",
        f"HTTP://127.0.0.1:{port}",
        f"http://127.1:{port}",  # aliases of one address (were accepted as another engine)
        f"http://2130706433:{port}",
        f"http://[::ffff:127.0.0.1]:{port}",
        f"http://127.0.0.1:{port}/v1/..",
    )
    for twin in twins:
        status, body = await admin(router.url, "POST", "/admin/workers", {"url": twin, "name": "twin"})
        assert status in (400, 409) and body["error"]["code"] in ("worker_conflict", "invalid_worker"), twin
    assert [w.name for w in router.state.pool] == ["w"]


async def test_kv_events_outside_key_mode_events_are_refused(echo_engine: Any, start_router: Any) -> None:
    router = await start_router(await echo_engine("w"), settings={"auth.admin_token": TOKEN})
    worker = {"url": "http://127.0.0.1:9", "name": "e", "kv_events": {"endpoint": "tcp://127.0.0.1:5557"}}
    status, body = await admin(router.url, "POST", "/admin/workers", worker)
    assert status == 400 and body["error"]["code"] == "invalid_worker", body
    assert "routing.keys.mode: events" in body["error"]["message"] and len(router.state.pool) == 1
