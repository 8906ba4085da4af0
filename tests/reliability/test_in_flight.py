"""One in-flight count, the routing core's: pass-through calls are routed (least load) and counted by it,
the caps, ``/metrics`` and ``/admin`` read it, an ejection keeps it, and it returns to zero after a storm
of mixed requests with failures, ejections and clients hanging up."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

EMBED = {"model": "m", "input": "a pass-through call"}
EMBEDDINGS = "/v1/embeddings"
TOKEN = "admin-token-for-load-tests"
STREAM = {"model": "m", "messages": [{"role": "user", "content": "count with me " * 20}], "stream": True}


async def get_json(url: str, token: str = TOKEN) -> Any:
    async with aiohttp.ClientSession() as http:
        resp = await http.get(url, headers={"Authorization": f"Bearer {token}"})
        assert resp.status == 200
        return orjson.loads(await resp.read())


async def gauges(url: str) -> dict[str, float]:
    """``prefix_router_in_flight`` by worker, read from ``/metrics``."""
    async with aiohttp.ClientSession() as http:
        text = await (await http.get(url + "/metrics")).text()
    return {
        s.labels["worker"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "prefix_router_in_flight"
        for s in family.samples
    }


async def views(router: Any) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    """The count per worker as ``/metrics``, ``/admin/workers`` and ``/admin/routing`` show it."""
    workers = (await get_json(router.url + "/admin/workers"))["workers"]
    summary = (await get_json(router.url + "/admin/routing"))["summary"]["workers"]
    return (
        await gauges(router.url),
        {w["name"]: w["in_flight"] for w in workers},
        {name: w["in_flight"] for name, w in summary.items()},
    )


def counts(router: Any) -> dict[str, int]:
    return {w.name: router.state.router.load.in_flight(w.name) for w in router.state.pool}


def assert_refused(result: tuple[int, Any, bytes], retry_after: int) -> None:
    status, headers, raw = result
    assert status == 429 and headers["Retry-After"] == str(retry_after)
    assert orjson.loads(raw)["error"]["code"] == "too_many_requests"


async def test_passthrough_calls_are_counted_and_held_to_the_per_worker_cap(
    recording_engine: Any, start_router: Any, kit: Any
) -> None:
    engine = await recording_engine("e", delay_s=0.6)
    settings = {"limits.max_in_flight_per_worker": 2, "limits.retry_after_s": 3}
    router = await start_router(engine, settings=settings)
    slow = [asyncio.ensure_future(kit.post(router.url, EMBED, path=EMBEDDINGS)) for _ in range(2)]
    await kit.wait_until(lambda: engine.active == 2)
    assert counts(router) == {"e": 2} and router.state.router.load.tracked() == 2

    assert_refused(await kit.post(router.url), 3)  # a routed request finds the worker full
    assert_refused(await kit.post(router.url, EMBED, path=EMBEDDINGS), 3)  # and so does a pass-through
    assert [r[0] for r in await asyncio.gather(*slow)] == [200, 200]

    burst = await asyncio.gather(*(kit.post(router.url, EMBED, path=EMBEDDINGS) for _ in range(8)))
    assert {r[0] for r in burst} <= {200, 429} and sum(r[0] == 200 for r in burst) >= 2
    assert engine.max_active == 2  # never more than the cap reached the engine
    await kit.wait_until(lambda: kit.quiescent(router))


async def test_the_global_cap_counts_passthrough_calls(
    recording_engine: Any, start_router: Any, kit: Any
) -> None:
    engine = await recording_engine("e", delay_s=0.6)
    router = await start_router(engine, settings={"limits.max_in_flight": 1, "limits.retry_after_s": 4})
    slow = asyncio.ensure_future(kit.post(router.url, EMBED, path=EMBEDDINGS))
    await kit.wait_until(lambda: engine.active == 1)
    assert router.state.pool.total_in_flight() == 1
    assert_refused(await kit.post(router.url), 4)
    assert_refused(await kit.post(router.url, EMBED, path=EMBEDDINGS), 4)
    assert (await slow)[0] == 200
    await kit.wait_until(lambda: kit.quiescent(router))
    assert (await kit.post(router.url))[0] == 200  # the cap frees up


async def test_passthrough_calls_go_to_the_least_loaded_worker_by_the_same_count(
    recording_engine: Any, start_router: Any, kit: Any
) -> None:
    a, b = await recording_engine("a", delay_s=0.8), await recording_engine("b", delay_s=0.8)
    router = await start_router(a, b)
    chat = asyncio.ensure_future(kit.post(router.url))  # a routed request makes one worker busier
    await kit.wait_until(lambda: a.active + b.active == 1)
    busy = "a" if a.active else "b"
    status, headers, _ = await kit.post(router.url, EMBED, path=EMBEDDINGS)
    assert status == 200 and headers["x-prefix-router-worker"] != busy
    assert "x-prefix-router-prefix-match" not in {k.lower() for k in headers}  # no prediction to report
    assert (await chat)[0] == 200
    assert len(router.state.router.index) > 0  # the chat was indexed ...
    entries = len(router.state.router.index)
    for _ in range(3):
        assert (await kit.post(router.url, EMBED, path=EMBEDDINGS))[0] == 200
    assert len(router.state.router.index) == entries  # ... the pass-through calls never are
    await kit.wait_until(lambda: kit.quiescent(router))


async def test_metrics_and_admin_show_the_routers_count(
    recording_engine: Any, start_router: Any, kit: Any
) -> None:
    a, b = await recording_engine("a", delay_s=2.0), await recording_engine("b", delay_s=2.0)
    router = await start_router(a, b, settings={"auth.admin_token": TOKEN})
    calls = [kit.post(router.url, EMBED, path=EMBEDDINGS) for _ in range(3)]
    calls += [kit.post(router.url, {**kit.CHAT, "user": str(i)}, headers=kit.RR) for i in range(2)]
    running = asyncio.gather(*calls)
    await kit.wait_until(lambda: a.active + b.active == 5)

    metrics, admin_workers, admin_routing = await views(router)
    core = counts(router)
    assert sum(core.values()) == 5 == router.state.pool.total_in_flight()
    assert metrics == {k: float(v) for k, v in core.items()}
    assert admin_workers == core == admin_routing
    assert core == {"a": a.active, "b": b.active}  # what the engines themselves see

    assert [r[0] for r in await running] == [200] * 5
    await kit.wait_until(lambda: kit.quiescent(router))
    metrics, admin_workers, admin_routing = await views(router)
    assert metrics == {"a": 0.0, "b": 0.0} and admin_workers == admin_routing == {"a": 0, "b": 0}


async def read_stream(url: str, body: dict[str, Any], started: asyncio.Event) -> bytes:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        resp = await http.post(url + "/v1/chat/completions", json=body)
        assert resp.status == 200
        first = await resp.content.readany()
        started.set()
        return first + await resp.read()


async def test_an_ejection_mid_request_keeps_the_count_until_the_requests_finish(
    recording_engine: Any, start_router: Any, kit: Any
) -> None:
    engine = await recording_engine("e", chunks=60, chunk_delay_s=0.04)  # ~2.4 s streams
    settings = {
        "health.interval_s": 0.05,
        "health.fail_threshold": 1,
        "health.success_threshold": 1,
        "auth.admin_token": TOKEN,
    }
    router = await start_router(engine, settings=settings)
    core = router.state.router
    started = [asyncio.Event() for _ in range(3)]
    streams = [
        asyncio.ensure_future(read_stream(router.url, {**STREAM, "user": str(i)}, started[i]))
        for i in range(3)
    ]
    await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 10)
    assert core.load.in_flight("e") == 3 and core.index.blocks_of("e") > 0

    engine.health_status = 500  # the health checks eject it while its three streams run on
    await kit.wait_until(lambda: not router.state.pool.require("e").health.healthy)
    assert core.index.blocks_of("e") == 0  # its cache is forgotten ...
    assert core.load.in_flight("e") == 3 == core.load.tracked()  # ... its running requests are not
    metrics, admin_workers, admin_routing = await views(router)
    assert metrics == {"e": 3.0} and admin_workers == admin_routing == {"e": 3}
    assert (await kit.post(router.url, EMBED, path=EMBEDDINGS))[0] == 503  # nobody to take new work

    engine.health_status = 200
    await kit.wait_until(lambda: router.state.pool.require("e").health.healthy)
    assert core.load.in_flight("e") == 3
    for raw in await asyncio.gather(*streams):
        assert kit.events(raw)[-1] == b"[DONE]"  # the ejection did not cut them
    await kit.wait_until(lambda: kit.quiescent(router))
    snap = core.load.snapshot("e", router.state.clock())
    assert (snap.in_flight, snap.pending_prefill_tokens) == (0, 0)
    assert (await kit.post(router.url))[0] == 200 and core.load.in_flight("e") == 0


async def hang_up_early(url: str, body: dict[str, Any], path: str) -> str:
    """A client that goes away after the first bytes (or at once when the answer is slow)."""
    with contextlib.suppress(TimeoutError, aiohttp.ClientError):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.15)) as http:
            resp = await http.post(url + path, json=body)
            await resp.content.readany()
    return "gone"


async def storm_request(router: Any, kit: Any, i: int, rng: random.Random) -> str:
    kind = rng.choice(["chat", "stream", "passthrough", "gone"])
    body = {**kit.CHAT, "user": f"u{i % 7}"}
    policy = {"x-prefix-router-policy": rng.choice(["round_robin", "random", "prefix"])}
    if kind == "stream":
        status, _, _ = await kit.post(router.url, {**body, "stream": True}, headers=policy)
    elif kind == "passthrough":
        status, _, _ = await kit.post(router.url, EMBED, path=EMBEDDINGS)
    elif kind == "gone":
        return await hang_up_early(router.url, {**body, "stream": True}, "/v1/chat/completions")
    else:
        status, _, _ = await kit.post(router.url, body, headers=policy)
    return str(status)


async def test_no_count_leaks_after_a_storm_of_mixed_requests_with_failures(
    recording_engine: Any, raw_engine: Any, start_router: Any, kit: Any
) -> None:
    good = [await recording_engine(f"rec{i}", chunks=8, chunk_delay_s=0.01, delay_s=0.02) for i in range(2)]
    bad = [await raw_engine("r500", "http_500"), await raw_engine("cut", "sse_then_close")]
    bad.append(await raw_engine("closer", "close"))
    settings = {"health.interval_s": 0.05, "health.fail_threshold": 1, "health.success_threshold": 1}
    router = await start_router(*good, *bad, settings={**settings, "retries.max_attempts": 2})
    core, names = router.state.router, [w.name for w in router.state.pool]
    violations: list[str] = []

    async def watch() -> None:  # the counts stay consistent at every moment, not only at the end
        while True:
            snaps = core.load.snapshots(names, router.state.clock())
            if any(s.in_flight < 0 or s.pending_prefill_tokens < 0 for s in snaps):
                violations.append(f"negative: {snaps}")
            if sum(core.load.in_flight(n) for n in names) != core.load.tracked():
                violations.append(f"sum of workers != total: {snaps}")
            await asyncio.sleep(0.003)

    async def flap() -> None:  # one good worker is ejected and re-admitted mid-storm
        await asyncio.sleep(0.2)
        good[1].health_status = 500
        await asyncio.sleep(0.3)
        good[1].health_status = 200

    watcher, flapper = asyncio.ensure_future(watch()), asyncio.ensure_future(flap())
    rng = random.Random(11)
    outcomes = await asyncio.gather(*(storm_request(router, kit, i, rng) for i in range(90)))
    await flapper
    await kit.wait_until(lambda: kit.quiescent(router))
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher

    assert violations == []
    assert {"200", "gone"} <= set(outcomes)  # both served and abandoned requests were in the mix
    for snap in core.load.snapshots(names, router.state.clock()):
        assert (snap.in_flight, snap.pending_prefill_tokens) == (0, 0), snap
    assert set((await gauges(router.url)).values()) == {0.0}
