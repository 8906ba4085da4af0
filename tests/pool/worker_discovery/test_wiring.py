"""``WorkerDiscovery``: the config section as a running source feeding a real WorkerPool (bounds, start-up
wait, counters), against the loopback fake Kubernetes API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.settings import DiscoverySettings
from prefix_router.pool.worker import Worker
from prefix_router.pool.worker_discovery.wiring import DiscoveryCollector, WorkerDiscovery, pod_namespace
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings


def settings(**kw: Any) -> DiscoverySettings:
    base = {"kind": "kubernetes", "service": "vllm", "namespace": "llm", "port_name": "http"}
    return DiscoverySettings.model_validate(base | {"watch_timeout_s": 1, "startup_wait_s": 2.0} | kw)


def slice_with(addresses: list[str]) -> dict[str, Any]:
    endpoints = [{"addresses": [a], "conditions": {"ready": True}} for a in addresses]
    item = {"metadata": {"name": "vllm-a"}, "endpoints": endpoints, "ports": [{"name": "http", "port": 8000}]}
    return {"metadata": {"resourceVersion": "1"}, "items": [item]}


async def test_membership_and_pool_stay_within_max_workers(api_server: Any) -> None:
    api_server.lists = [slice_with([f"10.0.0.{i}" for i in range(1, 6)])]
    pool = WorkerPool(Router(RoutingSettings()), max_workers=2)
    probed: list[str] = []

    async def probe(worker: Worker) -> None:
        probed.append(worker.name)

    found = WorkerDiscovery(settings(worker={"weight": 2.0}), pool, 3, probe, api=api_server.client())
    try:
        assert await found.start()
        assert len(found.membership.urls) == 3 and found.membership.over_limit == 2
        assert sorted(w.name for w in pool) == ["10.0.0.1:8000", "10.0.0.2:8000"]  # the pool's own cap
        assert all(w.weight == 2.0 for w in pool)
        stats = found.stats()
        assert stats["workers"] == 3 and stats["rejected"] == 1 and stats["failures"] == 0
    finally:
        await found.stop()
    assert sorted(probed) == ["10.0.0.1:8000", "10.0.0.2:8000"]


async def test_start_gives_up_after_startup_wait_and_counts_failures(api_server: Any) -> None:
    api_server.lists = [slice_with(["10.0.0.1"])]
    api_server.fail_next = 1000
    pool = WorkerPool(Router(RoutingSettings()), max_workers=4)
    found = WorkerDiscovery(settings(startup_wait_s=0.2), pool, 4, api=api_server.client())
    try:
        assert not await found.start()
        assert len(pool) == 0 and found.stats()["failures"] >= 1
        registry = CollectorRegistry()
        registry.register(DiscoveryCollector(found))
        text = generate_latest(registry).decode()
        assert "prefix_router_discovery_workers 0.0" in text
        assert "prefix_router_discovery_failures_total" in text
    finally:
        await found.stop()


def test_pod_namespace(tmp_path: Path) -> None:
    assert pod_namespace(tmp_path / "absent") == "default"
    (tmp_path / "ns").write_text("llm\n")
    assert pod_namespace(tmp_path / "ns") == "llm"


async def test_a_slices_role_label_gives_its_workers_their_role(api_server: Any) -> None:
    """``llm-d.ai/role`` on an EndpointSlice (Kubernetes copies the Service's labels onto its slices): its
    workers take that role; an unlabelled slice's keep the template's, an unknown value is ignored."""
    listed = slice_with(["10.0.0.1"])
    prefill = listed["items"][0]
    prefill["metadata"]["labels"] = {"llm-d.ai/role": "prefill"}
    decode = slice_with(["10.0.0.2"])["items"][0] | {"metadata": {"name": "vllm-b"}}
    odd = slice_with(["10.0.0.3"])["items"][0] | {
        "metadata": {"name": "vllm-c", "labels": {"llm-d.ai/role": "x"}}
    }
    listed["items"] += [decode, odd]
    api_server.lists = [listed]
    pool = WorkerPool(Router(RoutingSettings()), max_workers=8)
    found = WorkerDiscovery(settings(worker={"role": "decode"}), pool, 8, api=api_server.client())
    try:
        assert await found.start()
        roles = {w.name: w.role for w in pool}
        assert roles == {"10.0.0.1:8000": "prefill", "10.0.0.2:8000": "decode", "10.0.0.3:8000": "decode"}
        assert pool.disaggregated
    finally:
        await found.stop()
