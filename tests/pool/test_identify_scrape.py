"""Identification (listed models, bounded; engine) and metrics scraping into the Router's load view."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from prefix_router.pool.http import AiohttpFetcher, Fetched, FetchError
from prefix_router.pool.identify import Identifier, parse_models
from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.scrape import MetricsScraper
from prefix_router.pool.settings import ScrapeSettings, WorkerSettings
from prefix_router.routing.load import ENGINE_LOAD_STALE_S
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings

VLLM_METRICS = """# HELP vllm:num_requests_waiting waiting
vllm:num_requests_waiting{model_name="m"} 7.0
vllm:num_requests_running{model_name="m"} 3.0
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0
"""


def models_body(*ids: str, owner: str = "vllm") -> bytes:
    return orjson.dumps(
        {"object": "list", "data": [{"id": i, "object": "model", "owned_by": owner} for i in ids]}
    )


def test_parse_models_is_bounded_and_tolerant() -> None:
    body = {"data": [{"id": f"m{i}"} for i in range(50)] + [{"id": 3}, "junk"]}
    assert list(parse_models(body, 10) or {}) == [f"m{i}" for i in range(10)]
    assert parse_models({"data": "nope"}, 10) is None
    assert parse_models({"data": [{"id": 3}, "junk", {"id": "ok"}]}, 10) == {"ok": {"id": "ok"}}


async def test_identification_learns_models_and_detects_the_engine(pool: WorkerPool, fetcher: Any) -> None:
    fetcher.table["http://w1:8000/v1/models"] = Fetched(200, models_body("a", "b"))
    fetcher.table["http://w1:8000/metrics"] = Fetched(200, VLLM_METRICS.encode())
    worker = pool.require("w1")
    await Identifier(fetcher, 1.0, max_models=1, metrics_max_bytes=10_000).identify(worker)
    assert list(worker.listed_models or {}) == ["a"]  # bounded by max_models
    assert worker.adapter is not None and worker.adapter.name == "vllm"


async def test_identification_failure_keeps_the_previous_list(pool: WorkerPool, fetcher: Any) -> None:
    worker = pool.require("w1")
    worker.listed_models = {"old": {"id": "old"}}
    fetcher.table["http://w1:8000/v1/models"] = FetchError("down")
    await Identifier(fetcher, 1.0, 10, 10_000).identify(worker)
    assert list(worker.listed_models) == ["old"]
    assert worker.adapter is not None and worker.adapter.name == "generic"


async def test_configured_engine_needs_no_detection(router: Router, fetcher: Any) -> None:
    pool = WorkerPool(router, 4)
    worker = pool.add(WorkerSettings(url="http://s:1", engine="sglang"))
    await Identifier(fetcher, 1.0, 10, 10_000).identify(worker)
    assert worker.adapter is not None and worker.adapter.name == "sglang"
    assert "http://s:1/metrics" not in fetcher.calls


async def test_scrape_feeds_engine_load_and_capacity(router: Router, pool: WorkerPool, fetcher: Any) -> None:
    clock = [100.0]
    worker = pool.require("w1")
    fetcher.table["http://w1:8000/metrics"] = Fetched(200, VLLM_METRICS.encode())
    fetcher.table["http://w1:8000/v1/models"] = Fetched(200, models_body("m"))
    await Identifier(fetcher, 1.0, 10, 100_000).identify(worker)
    scraper = MetricsScraper(pool, router, fetcher, ScrapeSettings(), lambda: clock[0])
    await scraper.scrape_all()
    snap = router.load.snapshot("w1", 100.0)
    assert snap.queue_depth == 7 and snap.kv_usage == 0.25
    assert worker.learned_capacity == 16_000 and router.index.capacity_tokens("w1") == 16_000
    # the engine stops answering: its last load goes stale and stops counting, routing carries on
    fetcher.table["http://w1:8000/metrics"] = FetchError("timeout")
    clock[0] = 100.0 + ENGINE_LOAD_STALE_S + 1
    assert await scraper.scrape(worker) is None
    assert router.load.snapshot("w1", clock[0]).queue_depth == 0


async def test_a_recorded_vllm_cpu_page_gives_capacity_and_the_engine_block(
    router: Router, pool: WorkerPool, fetcher: Any, fixture_text: Any
) -> None:
    """vLLM 0.32's CPU build (recorded here): 64 blocks of 128 tokens; the router learns both."""
    worker = pool.require("w1")
    fetcher.table["http://w1:8000/metrics"] = Fetched(200, fixture_text("vllm_cpu_0.32_metrics.txt").encode())
    fetcher.table["http://w1:8000/v1/models"] = Fetched(
        200, fixture_text("vllm_cpu_0.32_models.json").encode()
    )
    await Identifier(fetcher, 1.0, 10, 100_000).identify(worker)
    assert worker.adapter is not None and worker.adapter.name == "vllm"
    assert router.engine_block_tokens("w1") is None
    await MetricsScraper(pool, router, fetcher, ScrapeSettings(), lambda: 1.0).scrape_all()
    assert worker.learned_capacity == 8192 and router.engine_block_tokens("w1") == 128


async def test_garbage_metrics_do_not_break_the_scrape(
    pool: WorkerPool, router: Router, fetcher: Any
) -> None:
    worker = pool.require("w1")
    from prefix_router.pool.engines import get_adapter

    worker.adapter = get_adapter("vllm")
    fetcher.table["http://w1:8000/metrics"] = Fetched(200, b"\x00\xffvllm:num_requests_waiting{ oops\n{{{")
    scraper = MetricsScraper(pool, router, fetcher, ScrapeSettings(), lambda: 1.0)
    await scraper.scrape_all()  # must not raise
    assert router.load.snapshot("w1", 1.0).queue_depth == 0


async def test_a_hung_metrics_endpoint_is_bounded_by_its_timeout(fake_engine: Any) -> None:
    from aiohttp import web

    from prefix_router.node.life.server import start

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response()

    app = web.Application()
    app.router.add_get("/metrics", hang)
    running = await start(app, shutdown_timeout=0.1)
    fetcher = AiohttpFetcher()
    try:
        router = Router(RoutingSettings())
        pool = WorkerPool(router, 4)
        worker = pool.add(WorkerSettings(url=running.url, engine="vllm"))
        from prefix_router.pool.engines import get_adapter

        worker.adapter = get_adapter("vllm")
        scraper = MetricsScraper(pool, router, fetcher, ScrapeSettings(timeout_s=0.2), lambda: 1.0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await scraper.scrape(worker) is None
        assert loop.time() - started < 5  # bounded by the 0.2 s timeout, not the engine's 30 s
    finally:
        await fetcher.close()
        await running.stop()


async def test_a_scrape_of_a_removed_worker_re_creates_nothing(
    router: Router, pool: WorkerPool, fetcher: Any
) -> None:
    from prefix_router.pool.engines import get_adapter
    from prefix_router.pool.engines.base import EngineLoad

    old = pool.require("w1")
    old.adapter = get_adapter("vllm")
    scraper = MetricsScraper(pool, router, fetcher, ScrapeSettings(), lambda: 5.0)
    load = EngineLoad(queue_depth=9, kv_usage=0.9, capacity_tokens=320)
    pool.remove("w1")
    scraper.apply(old, load)  # a scrape that was in flight when the worker left
    assert "w1" not in router.workers() and "w1" not in router.summary()["workers"]  # type: ignore[operator]
    pool.add(WorkerSettings(url="http://w1:8000", name="w1"))  # a new worker of the same name
    scraper.apply(old, load)  # the old worker's scrape never lands on its successor either
    snap = router.load.snapshot("w1", 5.0)
    assert (snap.queue_depth, snap.kv_usage) == (0, None)
    assert router.index.capacity_tokens("w1") == RoutingSettings().index.worker_capacity_tokens
