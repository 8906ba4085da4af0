"""Client API keys, the admin token and upstream credentials: compared in constant time, never logged,
never forwarded unless configured, never echoed back; no admin access without the token."""

from __future__ import annotations

import asyncio
import hmac
import logging
import sys
from typing import Any

import aiohttp
import pytest

import prefix_router.node.request.auth as auth_module

CLIENT_KEY = "sk-client-7f3a9c1e5b"
OTHER_KEY = "sk-client-other-d41d8c"
ADMIN_TOKEN = "admin-token-0b8e2f6a4c"
WORKER_KEY = "sk-worker-UPSTREAM-93e1a7"
SECRETS = (CLIENT_KEY, OTHER_KEY, ADMIN_TOKEN, WORKER_KEY)


def secured(**extra: Any) -> dict[str, Any]:
    return {"auth.api_keys": [CLIENT_KEY, OTHER_KEY], "auth.admin_token": ADMIN_TOKEN, **extra}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---------------------------------------------------------------------------------------- constant time


async def test_every_check_goes_through_compare_digest_on_fixed_length_digests(
    echo_engine: Any, start_router: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever is presented (right, wrong, a prefix of a key, empty, huge), the comparison is
    ``hmac.compare_digest`` over two 32-byte digests: its time cannot depend on how much of a key matched."""
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
    router = await start_router(await echo_engine(), settings=secured())
    presented = [CLIENT_KEY, CLIENT_KEY[:-1], CLIENT_KEY + "x", "", "x" * 100_000, ADMIN_TOKEN]
    for token in presented:
        await kit.post(router.url, headers=bearer(token))
        async with (
            aiohttp.ClientSession() as http,
            http.get(router.url + "/admin/workers", headers=bearer(token)),
        ):
            pass
    assert len(calls) >= 2 * len(presented) - 2  # (an empty bearer is no bearer: refused before hashing)
    assert set(calls) == {(32, 32)}


# ---------------------------------------------------------------------------------------- client keys


async def test_client_keys_are_required_on_every_v1_route(
    echo_engine: Any, start_router: Any, kit: Any
) -> None:
    engine = await echo_engine()
    router = await start_router(engine, settings=secured())
    paths = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/tokenize"]
    async with aiohttp.ClientSession() as http:
        async with http.get(router.url + "/v1/models") as resp:
            assert resp.status == 401
        for path in paths:
            for headers in ({}, bearer("wrong"), bearer(ADMIN_TOKEN), {"Authorization": CLIENT_KEY}):
                async with http.post(router.url + path, json=kit.ANY, headers=headers) as resp:
                    assert resp.status == 401, (path, headers)
                    assert kit.openai_error(await resp.read())["code"] == "invalid_api_key"
            async with http.post(router.url + path, json=kit.ANY, headers=bearer(OTHER_KEY)) as resp:
                assert resp.status == 200
    assert len(engine.seen) == len(paths)  # refused requests never reached the engine


# ---------------------------------------------------------------------------------------- admin


def admin_routes(router: Any) -> list[tuple[str, str]]:
    """Every admin route the app has (so that a route added later is covered too)."""
    routes = []
    for route in router.app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if path.startswith("/admin"):
            routes.append((route.method, path.replace("{name}", "w")))
    return routes


async def call_admin(url: str, method: str, path: str, headers: dict[str, str]) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url + path, json={"url": "http://127.0.0.1:9"}, headers=headers) as resp,
    ):
        return resp.status


async def test_admin_is_off_without_a_token(echo_engine: Any, start_router: Any) -> None:
    router = await start_router(await echo_engine("w"), settings={"auth.api_keys": [CLIENT_KEY]})
    routes = admin_routes(router)
    assert len(routes) >= 6
    for method, path in routes:
        for headers in ({}, bearer(""), bearer(CLIENT_KEY), bearer("None")):
            assert await call_admin(router.url, method, path, headers) == 404, (method, path)
    assert [w.name for w in router.state.pool] == ["w"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": ADMIN_TOKEN},
        {"Authorization": f"Basic {ADMIN_TOKEN}"},
        {"Authorization": f"Bearer {ADMIN_TOKEN[:-1]}"},
        {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
        {"Authorization": f"Bearer {CLIENT_KEY}"},
        {"Authorization": "Bearer "},
        {"X-Admin-Token": ADMIN_TOKEN},
        {"Cookie": f"token={ADMIN_TOKEN}"},
    ],
)
async def test_admin_refuses_anything_but_the_exact_bearer_token(
    echo_engine: Any, start_router: Any, headers: dict[str, str]
) -> None:
    router = await start_router(await echo_engine("w"), settings=secured())
    for method, path in admin_routes(router):
        assert await call_admin(router.url, method, path + f"?token={ADMIN_TOKEN}", headers) == 401
    assert [w.name for w in router.state.pool] == ["w"] and not router.state.pool.require("w").draining


async def test_admin_works_with_the_token(echo_engine: Any, start_router: Any) -> None:
    router = await start_router(await echo_engine("w"), settings=secured())
    assert await call_admin(router.url, "GET", "/admin/workers", bearer(ADMIN_TOKEN)) == 200
    assert await call_admin(router.url, "POST", "/admin/workers/w/drain", bearer(ADMIN_TOKEN)) == 200
    assert router.state.pool.require("w").draining


# ---------------------------------------------------------------------------------------- forwarding


@pytest.mark.parametrize("forward", [False, True])
async def test_client_keys_are_forwarded_only_when_configured(
    echo_engine: Any, start_router: Any, kit: Any, forward: bool
) -> None:
    engine = await echo_engine()
    router = await start_router(engine, settings=secured(**{"tenants.forward_client_auth": forward}))
    status, _, _ = await kit.post(router.url, headers={**bearer(CLIENT_KEY), "Cookie": "session=abc"})
    assert status == 200
    sent = engine.seen[-1][2]
    assert sent.get("Authorization") == (f"Bearer {CLIENT_KEY}" if forward else None)
    assert "Cookie" not in sent


@pytest.mark.parametrize("forward", [False, True])
async def test_a_worker_credential_replaces_the_client_key(
    echo_engine: Any, start_router: Any, kit: Any, forward: bool
) -> None:
    engine = await echo_engine()
    worker = {"url": engine.url, "name": "w", "api_key": WORKER_KEY}
    router = await start_router(worker, settings=secured(**{"tenants.forward_client_auth": forward}))
    await kit.post(router.url, headers=bearer(CLIENT_KEY))
    assert engine.seen[-1][2]["Authorization"] == f"Bearer {WORKER_KEY}"
    assert all(CLIENT_KEY not in str(headers) for _, _, headers, _ in engine.seen)


# ---------------------------------------------------------------------------------------- echoes


@pytest.mark.parametrize("status", [200, 500, 401])
async def test_upstream_credentials_are_never_echoed_back(
    echo_engine: Any, start_router: Any, kit: Any, status: int
) -> None:
    engine = await echo_engine("w", echo_auth=True, status=status)
    router = await start_router({"url": engine.url, "name": "w", "api_key": WORKER_KEY}, settings=secured())
    seen: list[bytes] = []
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        got, headers, body = await kit.post(router.url, kit.ANY, bearer(CLIENT_KEY), path)
        assert got == status and engine.seen[-1][2]["Authorization"] == f"Bearer {WORKER_KEY}"
        seen += [str(dict(headers)).encode(), body]
    async with aiohttp.ClientSession() as http:
        reads = [("/admin/workers", bearer(ADMIN_TOKEN)), ("/admin/routing", bearer(ADMIN_TOKEN))]
        for path, headers in [*reads, ("/metrics", {}), ("/v1/models", bearer(CLIENT_KEY))]:
            async with http.get(router.url + path, headers=headers) as resp:
                seen.append(await resp.read())
    assert all(WORKER_KEY.encode() not in blob for blob in seen)
    assert any(b"[redacted]" in blob for blob in seen)  # the engine did echo it: the router blanked it


async def test_print_config_masks_every_secret(tmp_path: Any) -> None:
    config = tmp_path / "c.yaml"
    workers = f"workers: [{{url: 'http://127.0.0.1:9', api_key: {WORKER_KEY}}}]"
    config.write_text(f"{workers}\nauth: {{admin_token: {ADMIN_TOKEN}, api_keys: [{CLIENT_KEY}]}}\n")
    argv = ["-m", "prefix_router.proxy", "serve", "--config", str(config), "--print-config"]
    proc = await asyncio.create_subprocess_exec(sys.executable, *argv, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and b"admin_token" in out
    assert all(secret.encode() not in out for secret in SECRETS)


# ---------------------------------------------------------------------------------------- logs


async def test_secrets_never_reach_the_logs(
    echo_engine: Any, start_router: Any, kit: Any, caplog: pytest.LogCaptureFixture, free_port: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    engine = await echo_engine("w", echo_auth=True)
    dead = {"url": f"http://127.0.0.1:{free_port()}", "name": "dead", "api_key": WORKER_KEY}
    worker = {"url": engine.url, "name": "w", "api_key": WORKER_KEY}
    router = await start_router(worker, dead, settings=secured(**{"health.fail_threshold": 1}))
    for token in (*SECRETS, "wrong-" + CLIENT_KEY):
        await kit.post(router.url, headers=bearer(token))
        await kit.post(router.url, body=b"not json", headers=bearer(token))
        await call_admin(router.url, "GET", "/admin/workers", bearer(token))
        await call_admin(router.url, "POST", "/admin/workers", bearer(token))
    await router.state.monitor.prober.probe_all()
    assert any(r.name.startswith("prefix_router") for r in caplog.records)  # the router did log
    text = caplog.text + " ".join(str(r.args) for r in caplog.records)
    assert all(secret not in text for secret in SECRETS)
