"""The pool monitor running inside the app: probes eject and re-admit, scrapes feed the router."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from prefix_router.protocol import WORKER_HEADER

VLLM = 'vllm:num_requests_waiting{model_name="m"} 9\nvllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
FAST = {"health.interval_s": 0.05, "health.fail_threshold": 2, "health.success_threshold": 2,
        "scrape.interval_s": 0.05}  # fmt: skip


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout_s)


async def test_probes_eject_and_readmit_while_serving(fake_engine: Any, start_router: Any) -> None:
    a, b = await fake_engine("a"), await fake_engine("b")
    router = await start_router(a, b, settings=FAST)
    worker_a = router.state.pool.require("a")
    a.b.health_status = 503
    await until(lambda: not worker_a.health.healthy)
    client = router.openai()
    for i in range(6):
        raw = await client.completions.with_raw_response.create(model="m", prompt=f"p{i}")
        assert raw.headers[WORKER_HEADER] == "b"
    text = router.state.metrics.render().decode()
    assert 'prefix_router_worker_healthy{worker="a"} 0.0' in text
    a.b.health_status = 200
    await until(lambda: worker_a.health.healthy)


async def test_scrapes_feed_engine_load_into_routing(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a", metrics_text=VLLM)
    router = await start_router({"url": engine.url, "name": "a", "engine": "vllm"}, settings=FAST)
    core = router.state.router
    clock = router.state.clock
    await until(lambda: core.load.snapshot("a", clock()).queue_depth == 9)
    assert core.load.snapshot("a", clock()).kv_usage == 0.5


async def test_engine_is_detected_from_metrics(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a", metrics_text=VLLM)
    router = await start_router(engine)
    worker = router.state.pool.require("a")
    assert worker.adapter is not None and worker.adapter.name == "vllm"
    assert orjson.loads(orjson.dumps(router.state.pool.public(worker)))["engine"] == "vllm"


async def test_an_engine_restarted_with_another_model_serves_it_after_the_next_probe(
    fake_engine: Any, start_router: Any
) -> None:
    """Restarted within the ejection time (one failed probe, never ejected) with another model: its models
    are read again at the next probe (they waited for the 30 s refresh: 404 model_not_found meanwhile)."""
    engine = await fake_engine("a")
    router = await start_router(engine, settings={**FAST, "health.fail_threshold": 100})
    worker = router.state.pool.require("a")
    engine.b.health_status = 503  # down for a moment: a probe fails
    await until(lambda: worker.health.failures > 0)
    engine.b.models, engine.b.health_status = ["m2"], 200  # back, serving another model
    assert worker.health.healthy and router.state.config.health.models_interval_s > 10  # no refresh here
    await until(lambda: worker.serves("m2"), timeout_s=3)
    body = {"model": "m2", "messages": [{"role": "user", "content": "hi"}]}
    url = router.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
        assert r.status == 200 and r.headers[WORKER_HEADER] == "a"


async def test_a_broken_connection_marks_the_worker_s_identity_stale(
    fake_engine: Any, start_router: Any, free_port: Any
) -> None:
    engine = await fake_engine("b")
    router = await start_router({"url": f"http://127.0.0.1:{free_port()}", "name": "gone"}, engine)
    router.admit("gone")
    gone = router.state.pool.require("gone")
    gone.identity_stale = False
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http:
        for _ in range(2):  # one of them tries "gone" first (a connect failure), then "b"
            async with http.post(
                router.url + "/v1/chat/completions",
                json=body,
                headers={"x-prefix-router-policy": "round_robin"},
            ) as resp:
                assert resp.status == 200
    assert gone.identity_stale
