"""Tenant isolation (``routing.keys.isolate_tenants``; a tenant is the client's bearer token): one tenant's
requests can never match, probe or evict another tenant's prefixes, nor follow or redirect its sessions.
The control runs (isolation off) show the side channel these tests close."""

from __future__ import annotations

from typing import Any

import pytest

from prefix_router.protocol import MATCH_HEADER, SESSION_HEADER, WORKER_HEADER
from prefix_router.proxy.auth import tenant_of

SYSTEM = "Confidential system prompt of tenant A: the merger closes on Friday. " * 20
A, B = {"Authorization": "Bearer key-tenant-a"}, {"Authorization": "Bearer key-tenant-b"}


def chat(user: str, system: str = SYSTEM) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }


async def three_workers(echo_engine: Any, start_router: Any, isolate: bool, **settings: Any) -> Any:
    engines = [await echo_engine(f"w{i}") for i in range(3)]
    return await start_router(*engines, settings={"routing.keys.isolate_tenants": isolate, **settings})


def blocks_of(router: Any, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, ...]:
    tenant = tenant_of(headers) if router.state.config.routing.keys.isolate_tenants else None
    route = router.state.router.keys.build("chat", body, request_id="probe", tenant=tenant)
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
    router = await start_router(
        *failing, settings={"routing.keys.isolate_tenants": True, "retries.max_attempts": 2}
    )
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
