"""Tenant isolation (``tenants.isolate``, on by default with several client keys; a tenant
is the client's bearer token): one tenant's requests can never match, probe or evict another tenant's
prefixes, nor follow or redirect its sessions; the decision headers can be hidden; with
``tenants.cache_salt`` the engines' own caches (vLLM) are kept apart too. The control runs show the side
channels these tests close."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from prefix_router.lab.sim.server import EngineSimSettings, build_app
from prefix_router.node.request.auth import tenant_of
from prefix_router.protocol import MATCH_HEADER, SESSION_HEADER, WORKER_HEADER
from support.bodies import ask

SYSTEM = "Confidential system prompt of tenant A: the merger closes on Friday. " * 20
A, B = {"Authorization": "Bearer key-tenant-a"}, {"Authorization": "Bearer key-tenant-b"}


def chat(user: str, system: str = SYSTEM) -> dict[str, Any]:
    return ask(user, system)


async def three_workers(echo_engine: Any, start_router: Any, isolate: bool, **settings: Any) -> Any:
    engines = [await echo_engine(f"w{i}") for i in range(3)]
    return await start_router(*engines, settings={"tenants.isolate": isolate, **settings})


def blocks_of(router: Any, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, ...]:
    tenant = tenant_of(headers) if router.state.config.tenants.isolate else None
    route = router.state.router.keys.build("chat", body, route_id="probe", tenant=tenant)
    blocks: tuple[int, ...] = route.blocks
    return blocks


@pytest.mark.parametrize("isolate", [True, False])
async def test_another_tenant_cannot_match_or_probe_a_prefix(
    echo_engine: Any, start_router: Any, kit: Any, isolate: bool
) -> None:
    router = await three_workers(echo_engine, start_router, isolate)
    for i in range(2):
        _, headers, _ = await kit.post(router.url, chat(f"question {i}"), A)
    assert int(headers[MATCH_HEADER]) > 0  # the prefix cache works within tenant A
    _, probe, _ = await kit.post(router.url, chat("question 0"), B)  # B replays A's exact prompt
    if isolate:
        assert int(probe[MATCH_HEADER]) == 0 and probe[WORKER_HEADER]
        assert not set(blocks_of(router, chat("q"), A)) & set(blocks_of(router, chat("q"), B))
    else:  # control: without isolation, B learns that A's prompt is cached, and where
        assert int(probe[MATCH_HEADER]) > 0 and probe[WORKER_HEADER] == headers[WORKER_HEADER]


async def test_another_tenant_cannot_evict_a_prefix(echo_engine: Any, start_router: Any, kit: Any) -> None:
    """B replays A's prompts on workers that fail (the index trims what a failed request inserted) and
    floods the index with them: A's entries stay."""
    failing = [await echo_engine(f"f{i}", status=503) for i in range(2)]
    router = await start_router(*failing, settings={"tenants.isolate": True, "retries.max_attempts": 2})
    index = router.state.router.index
    for engine in failing:
        engine.status = 200
    await kit.post(router.url, chat("question"), A)
    held = index.match(blocks_of(router, chat("question"), A))
    assert held and max(held.values()) > 0
    for engine in failing:
        engine.status = 503
    for i in range(20):
        status, _, _ = await kit.post(router.url, chat("question" if i % 2 else f"q{i}"), B)
        assert status == 503
    assert index.match(blocks_of(router, chat("question"), A)) == held


@pytest.mark.parametrize("isolate", [True, False])
async def test_another_tenant_cannot_follow_or_redirect_a_session(
    echo_engine: Any, start_router: Any, kit: Any, isolate: bool
) -> None:
    router = await three_workers(echo_engine, start_router, isolate)
    session = {SESSION_HEADER: "shared-session-id"}
    _, first, _ = await kit.post(router.url, chat("a0", system="a"), {**A, **session})
    home = first[WORKER_HEADER]
    router.state.pool.drain(home)  # B's requests now go elsewhere...
    for i in range(3):
        await kit.post(router.url, chat(f"b{i}", system="b"), {**B, **session})
    router.state.pool.drain(home, False)
    _, after, _ = await kit.post(router.url, chat("a1", system="a"), {**A, **session})
    if isolate:  # ...and A's session still leads home
        assert after[WORKER_HEADER] == home
    else:  # control: B's use of the same id moved A's session
        assert after[WORKER_HEADER] != home


async def test_isolation_is_on_by_default_with_several_keys(
    echo_engine: Any, start_router: Any, kit: Any
) -> None:
    """Several client keys, ``tenants.isolate`` left unset: tenants are isolated (before: the
    side channel of the control run above was open by default)."""
    engines = [await echo_engine(f"w{i}") for i in range(3)]
    keys = ["key-tenant-a", "key-tenant-b"]
    router = await start_router(*engines, settings={"auth.api_keys": keys})
    assert router.state.config.tenants.isolate is True
    for i in range(2):
        _, headers, _ = await kit.post(router.url, chat(f"question {i}"), A)
    assert int(headers[MATCH_HEADER]) > 0
    _, probe, _ = await kit.post(router.url, chat("question 0"), B)
    assert int(probe[MATCH_HEADER]) == 0
    one_key = await start_router(*engines, settings={"auth.api_keys": keys[:1]})
    assert one_key.state.config.tenants.isolate is False  # one key: one tenant


DECISION_HEADERS = (WORKER_HEADER, MATCH_HEADER)


@pytest.mark.parametrize("shown", [True, False])
async def test_decision_headers_can_be_hidden(
    echo_engine: Any, start_router: Any, kit: Any, shown: bool
) -> None:
    ok, failing = await echo_engine("ok"), await echo_engine("failing", status=503)
    router = await start_router(ok, settings={"tenants.decision_headers": shown})
    alone = await start_router(failing, settings={"tenants.decision_headers": shown})
    answers = [
        await kit.post(router.url, chat("plain"), A),
        await kit.post(router.url, {**chat("streamed"), "stream": True}, A),
        await kit.post(router.url, kit.ANY, A, path="/v1/embeddings"),
        await kit.post(alone.url, chat("relayed 503"), A),
    ]
    assert [status for status, _, _ in answers] == [200, 200, 200, 503]
    for _, headers, _ in answers:
        present = {h for h in DECISION_HEADERS if h in headers}
        assert present if shown else not present, (shown, present)


# vLLM's cache_salt: engine-sim (a simulated vLLM, detected as one from its /metrics) keys its simulated
# prefix cache by it, and reports cached prompt tokens in usage like vLLM does


async def sim_usage(kit: Any, url: str, body: dict[str, Any], headers: dict[str, str]) -> int:
    status, _, raw = await kit.post(url, {**body, "max_tokens": 2}, headers)
    assert status == 200, raw
    details = orjson.loads(raw)["usage"].get("prompt_tokens_details") or {}
    cached: int = details.get("cached_tokens") or 0
    return cached


@pytest.mark.parametrize("salted", [True, False])
async def test_the_cache_salt_keeps_engine_caches_apart(
    serve_app: Any, start_router: Any, kit: Any, salted: bool
) -> None:
    engine = await serve_app(build_app(EngineSimSettings(model="m", time_scale=0.01)))
    settings = {"tenants.cache_salt": salted, "auth.api_keys": ["key-tenant-a", "key-tenant-b"]}
    router = await start_router({"url": engine.url, "name": "sim"}, settings=settings)
    assert router.state.pool.require("sim").adapter.name == "vllm"  # type: ignore[union-attr]
    await sim_usage(kit, router.url, chat("first"), A)
    assert await sim_usage(kit, router.url, chat("first"), A) > 0  # A's own cache serves A
    cached_for_b = await sim_usage(kit, router.url, chat("first"), B)  # B replays A's prompt: TTFT probe
    if salted:
        assert cached_for_b == 0  # nothing of A's cache reaches B: no timing side channel left
        own = {**chat("first"), "cache_salt": "mine"}
        await sim_usage(kit, router.url, own, A)
        assert await sim_usage(kit, router.url, own, A) > 0  # a client's own salt still works...
        assert await sim_usage(kit, router.url, own, B) == 0  # ...within its tenant only
    else:  # control: the engine's cache is shared, and B's prompt is served from A's blocks
        assert cached_for_b > 0


async def test_the_cache_salt_goes_only_to_vllm_workers(
    echo_engine: Any, start_router: Any, kit: Any
) -> None:
    engine = await echo_engine("generic")
    settings = {"tenants.cache_salt": True, "auth.api_keys": ["key-tenant-a", "key-tenant-b"]}
    router = await start_router(engine, {"url": engine.url + "/vllm", "name": "vllm", "engine": "vllm"},
                                settings=settings)  # fmt: skip
    body = orjson.dumps(chat("bytes"))
    for name in ("generic", "vllm"):
        router.state.pool.drain("vllm" if name == "generic" else "generic")
        router.state.pool.drain(name, False)
        status, _, _ = await kit.post(router.url, body, A)
        assert status == 200
        sent = engine.seen[-1][3]
        if name == "generic":
            assert sent == body  # forwarded byte for byte
        else:
            salt = orjson.loads(sent)["cache_salt"]
            assert isinstance(salt, str) and len(salt) == 32 and "key-tenant-a" not in salt
