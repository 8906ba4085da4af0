"""Health probes: fallback path, ejection and re-admission, against scripted and real engines."""

from __future__ import annotations

from typing import Any

from prefix_router.pool.health import HealthProber
from prefix_router.pool.http import AiohttpFetcher, Fetched, FetchError
from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.settings import HealthSettings, WorkerSettings
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings


async def test_health_falls_back_to_models_and_remembers(pool: WorkerPool, fetcher: Any) -> None:
    fetcher.table.update(
        {"http://w1:8000/health": Fetched(404, b""), "http://w1:8000/v1/models": Fetched(200, b"{}")}
    )
    prober = HealthProber(pool, fetcher, HealthSettings())
    assert await prober.probe(pool.require("w1"))
    assert pool.require("w1").health_path == "/v1/models"
    fetcher.calls.clear()
    await prober.probe(pool.require("w1"))
    assert fetcher.calls == ["http://w1:8000/v1/models"]


async def test_probe_failures_eject_and_successes_readmit(router: Router, fetcher: Any) -> None:
    pool = WorkerPool(router, max_workers=4, thresholds=(2, 3))
    w1 = pool.add(WorkerSettings(url="http://w1:8000", name="w1"))
    pool.add(WorkerSettings(url="http://w2:8000", name="w2"))
    fetcher.table["http://w2:8000/health"] = Fetched(200, b"ok")
    prober = HealthProber(pool, fetcher, HealthSettings())
    assert w1.health.verdict == "pending" and not w1.available  # not healthy before a probe passed
    await prober.probe_all()
    assert w1.health.verdict == "pending" and "refused" in (w1.health.last_error or "")
    assert pool.require("w2").health.healthy  # admitted by its first passing probe
    fetcher.table["http://w1:8000/health"] = Fetched(200, b"")
    await prober.probe_all()
    assert w1.health.verdict == "healthy"
    del fetcher.table["http://w1:8000/health"]
    await prober.probe_all()
    assert w1.health.healthy and "refused" in (w1.health.last_error or "")
    await prober.probe_all()
    assert w1.health.verdict == "ejected" and pool.require("w2").health.healthy
    fetcher.table["http://w1:8000/health"] = Fetched(503, b"")  # answering, but unhealthy
    await prober.probe_all()
    assert "503" in (w1.health.last_error or "")
    fetcher.table["http://w1:8000/health"] = Fetched(200, b"")
    for expected in (False, False, True):
        await prober.probe_all()
        assert w1.health.healthy is expected


async def test_a_removed_worker_is_not_reported(pool: WorkerPool, fetcher: Any) -> None:
    fetcher.table["http://w1:8000/health"] = FetchError("x")
    prober = HealthProber(pool, fetcher, HealthSettings())
    worker = pool.remove("w1")
    await prober.probe(worker)
    assert worker.health.failures == 0


async def test_real_engine_goes_down_and_comes_back(fake_engine: Any) -> None:
    engine = await fake_engine("e")
    pool = WorkerPool(Router(RoutingSettings()), max_workers=4, thresholds=(2, 2))
    worker = pool.add(WorkerSettings(url=engine.url, name="e"))
    fetcher = AiohttpFetcher()
    prober = HealthProber(pool, fetcher, HealthSettings(timeout_s=1.0))
    try:
        assert await prober.probe(worker) and worker.health_path == "/health"
        engine.b.health_status = 500
        await prober.probe(worker)
        await prober.probe(worker)
        assert not worker.health.healthy
        engine.b.health_status = 200
        await prober.probe(worker)
        await prober.probe(worker)
        assert worker.health.healthy
    finally:
        await fetcher.close()
