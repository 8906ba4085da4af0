"""Admin API (bearer token, off without one) and client API keys; credentials never leak."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import orjson
import pytest

from prefix_router.protocol import WORKER_HEADER

TOKEN = "admin-secret-token"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


async def admin(
    url: str, method: str, path: str, token: str | None = TOKEN, body: Any = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        resp = await http.request(
            method, url + path, headers=headers, data=orjson.dumps(body) if body else None
        )
        return resp.status, orjson.loads(await resp.read())


async def test_admin_is_off_without_a_token(fake_engine: Any, start_router: Any) -> None:
    router = await start_router(await fake_engine("a"))
    for token in (None, "anything-at-all"):
        status, body = await admin(router.url, "GET", "/admin/workers", token)
        assert status == 404 and body["error"]["code"] == "not_found"


@pytest.mark.parametrize("token", [None, "wrong-token-value", TOKEN + "x", TOKEN[:-1]])
async def test_admin_refuses_wrong_tokens(fake_engine: Any, start_router: Any, token: str | None) -> None:
    router = await start_router(await fake_engine("a"), settings={"auth.admin_token": TOKEN})
    for method, path in [
        ("GET", "/admin/workers"),
        ("DELETE", "/admin/workers/a"),
        ("GET", "/admin/routing"),
    ]:
        status, body = await admin(router.url, method, path, token)
        assert status == 401 and set(body["error"]) == {"message", "type", "param", "code"}
    assert router.state.pool.get("a") is not None


async def test_admin_lists_adds_drains_and_removes(fake_engine: Any, start_router: Any) -> None:
    a = await fake_engine("a")
    b = await fake_engine("b")
    settings = {"auth.admin_token": TOKEN}
    router = await start_router({"url": a.url, "name": "a", "api_key": "upstream-secret"}, settings=settings)
    status, body = await admin(router.url, "GET", "/admin/workers")
    assert status == 200 and [w["name"] for w in body["workers"]] == ["a"]
    assert "upstream-secret" not in orjson.dumps(body).decode()

    status, body = await admin(router.url, "POST", "/admin/workers", body={"url": b.url, "name": "b"})
    assert status == 201 and body["worker"]["models"] == ["m"] and body["worker"]["healthy"]
    status, _ = await admin(router.url, "POST", "/admin/workers", body={"url": b.url, "name": "b"})
    assert status == 409
    status, body = await admin(router.url, "POST", "/admin/workers", body={"url": "ftp://x"})
    assert status == 400 and "url" in body["error"]["message"]

    status, _ = await admin(router.url, "POST", "/admin/workers/a/drain")
    assert status == 200
    client = aiohttp.ClientSession()
    async with client:
        for _ in range(4):
            resp = await client.post(router.url + "/v1/chat/completions", json=CHAT)
            assert resp.headers[WORKER_HEADER] == "b"
    status, body = await admin(router.url, "GET", "/admin/routing")
    assert status == 200 and set(body["summary"]["workers"]) == {"a", "b"}

    status, _ = await admin(router.url, "DELETE", "/admin/workers/b")
    assert status == 200 and router.state.pool.get("b") is None
    assert "b" not in router.state.router.workers()
    status, _ = await admin(router.url, "DELETE", "/admin/workers/b")
    assert status == 404
    status, _ = await admin(router.url, "POST", "/admin/workers/a/undrain")
    assert status == 200 and router.state.pool.require("a").available


async def test_client_api_keys(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a")
    router = await start_router(engine, settings={"auth.api_keys": ["key-one", "key-two"]})
    with pytest.raises(openai.AuthenticationError):
        await router.openai(api_key="bad").chat.completions.create(**CHAT)
    with pytest.raises(openai.AuthenticationError):
        await router.openai(api_key="bad").models.list()
    async with aiohttp.ClientSession() as http:
        resp = await http.post(router.url + "/v1/chat/completions", json=CHAT)  # no Authorization at all
        assert resp.status == 401
    reply = await router.openai(api_key="key-two").chat.completions.create(**CHAT)
    assert reply.choices[0].message.content
    assert len(engine.generations) == 1
    assert "Authorization" not in engine.generations[0].headers  # client keys are not forwarded


async def test_upstream_credentials_replace_the_clients_and_never_come_back(
    fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("a")
    worker = {"url": engine.url, "name": "a", "api_key": "upstream-secret"}
    router = await start_router(worker, settings={"auth.admin_token": TOKEN})
    raw = await router.openai(api_key="client-key").chat.completions.with_raw_response.create(**CHAT)
    assert engine.generations[0].headers["Authorization"] == "Bearer upstream-secret"
    assert "upstream-secret" not in str(raw.headers) and b"upstream-secret" not in raw.http_response.content
    metrics = router.state.metrics.render()
    assert b"upstream-secret" not in metrics and b"client-key" not in metrics
    assert engine.seen and all(
        s.headers.get("Authorization") == "Bearer upstream-secret" for s in engine.seen
    )


async def test_client_auth_is_forwarded_only_when_configured(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a")
    router = await start_router(engine, settings={"tenants.forward_client_auth": True})
    await router.openai(api_key="client-key").chat.completions.create(**CHAT)
    assert engine.generations[0].headers["Authorization"] == "Bearer client-key"


async def test_admin_bodies_are_bounded(fake_engine: Any, start_router: Any) -> None:
    router = await start_router(await fake_engine("a"), settings={"auth.admin_token": TOKEN})
    big = {"url": "http://x:1", "pad": "x" * 100_000}
    status, body = await admin(router.url, "POST", "/admin/workers", body=big)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    status, body = await admin(router.url, "POST", "/admin/workers", body=[1, 2])
    assert status == 400
