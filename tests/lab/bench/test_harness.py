from __future__ import annotations

from typing import Any

from prefix_router.lab.bench.harness import BenchPlan, run_bench
from prefix_router.lab.bench.summary import SCHEMA_KEYS
from prefix_router.lab.workloads.registry import get_workload
from support.engines import FakeEngine


def _plan(engines: list[FakeEngine], **kw: Any) -> BenchPlan:
    workload = get_workload("chatbots", requests=12, seed=0, model="", tenants=3, system_tokens=64)
    kw.setdefault("policies", ("random", "prefix"))
    return BenchPlan(workers=tuple(e.url for e in engines), workload=workload, progress=False, settle_s=0.0,
                     warmup_requests=1, **kw)  # fmt: skip


async def test_in_process_router_per_policy(fake_pair: list[FakeEngine]) -> None:
    outcome = await run_bench(_plan(fake_pair))
    doc = outcome.document
    assert doc["simulated"] is False and doc["baseline"] == "random" and doc["workload"] == "chatbots"
    assert doc["model"] == "fake-model"
    for name in ("random", "prefix"):
        summary = doc["policies"][name]
        assert set(SCHEMA_KEYS) <= set(summary)
        assert summary["requests"] == 12 and summary["errors"] == 0
        assert sum(summary["requests_per_worker"].values()) == 12
        assert summary["requests_per_worker_source"] == "router header"
        assert summary["hit_rate"] is not None and summary["predicted_hit_rate"] is not None
    assert all(e.resets == 2 for e in fake_pair)
    bodies = [b for e in fake_pair for b in e.bodies if "messages" in b]
    assert len(bodies) == 24 and all(b["model"] == "fake-model" for b in bodies)
    assert set(outcome.ttfts()) == {"random", "prefix"}


async def test_external_router_counts_requests_from_engine_metrics(fake_pair: list[FakeEngine]) -> None:
    fake_pair[0].b.worker_header = False
    plan = _plan(fake_pair, router_url=fake_pair[0].url, policies=("direct",), reset=False, simulated=True)
    doc = (await run_bench(plan)).document
    summary = doc["policies"]["direct"]
    assert doc["simulated"] is True and doc["router"] == fake_pair[0].url
    assert summary["requests_per_worker"] == {fake_pair[0].url: 12, fake_pair[1].url: 0}
    assert summary["requests_per_worker_source"] == "engine counters"
    assert all(e.resets == 0 for e in fake_pair)


async def test_the_sglang_emulation_runs_in_process_like_any_policy(fake_pair: list[FakeEngine]) -> None:
    """The peer baseline is a policy of the in-process router: same engines, same requests."""
    outcome = await run_bench(_plan(fake_pair, policies=("sglang_cache_aware",)))
    summary = outcome.document["policies"]["sglang_cache_aware"]
    assert summary["requests"] == 12 and summary["errors"] == 0
    assert sum(summary["requests_per_worker"].values()) == 12
