"""InferencePool discovery: the pool's selector and target ports, its ready pods, through the official
client against a loopback API server (the pods list and watch, the pool object)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from kubernetes.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi

from prefix_router.node.config import Config
from prefix_router.pool import WorkerPool
from prefix_router.pool.settings import DiscoverySettings
from prefix_router.pool.worker_discovery.inference_pool import PodTable, PoolInvalid, pool_target
from prefix_router.pool.worker_discovery.kubernetes import InferencePoolDiscovery
from prefix_router.pool.worker_discovery.membership import Membership
from prefix_router.pool.worker_discovery.pool_sink import PoolSink
from prefix_router.proxy import start
from prefix_router.routing import Router

POOL_PATH = "/apis/inference.networking.k8s.io/v1/namespaces/{namespace}/inferencepools/{name}"
PODS_PATH = "/api/v1/namespaces/{namespace}/pods"


def pool(labels: dict[str, str], ports: list[int]) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "llm", "namespace": "serving"},
        "spec": {
            "selector": {"matchLabels": labels},
            "targetPorts": [{"number": p} for p in ports],
            "endpointPickerRef": {"name": "prefix-router-epp", "port": {"number": 9002}},
        },
    }


def pod(name: str, ip: str | None, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {"app": "vllm"}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip is not None:
        status["podIP"] = ip
    return {"kind": "Pod", "apiVersion": "v1", "metadata": metadata, "status": status}


def test_pool_target_and_pod_readiness() -> None:
    target = pool_target(pool({"app": "vllm", "tier": "a"}, [8000, 8001]))
    assert target.selector == "app=vllm,tier=a" and target.ports == (8000, 8001)
    with pytest.raises(PoolInvalid):
        pool_target(pool({}, [8000]))
    with pytest.raises(PoolInvalid):
        pool_target(pool({"app": "vllm"}, []))
    table = PodTable(2, target)
    table.reset([pod("p1", "10.1.0.1"), pod("p2", "10.1.0.2", ready=False), pod("p3", "10.1.0.3")])
    assert table.urls() == {"http://10.1.0.1:8000", "http://10.1.0.1:8001"}  # p3: over max_pods
    assert table.ignored == 1
    assert table.apply("MODIFIED", pod("p2", "10.1.0.2"))
    assert "http://10.1.0.2:8000" in table.urls()
    assert table.apply("MODIFIED", pod("p1", "10.1.0.1", deleting=True))
    assert table.apply("DELETED", pod("p2", None))
    assert table.urls() == set()
    assert PodTable(1, target).apply("ADDED", pod("p4", None)) and not PodTable(1, target).urls()


def test_settings_accept_an_inference_pool() -> None:
    settings = DiscoverySettings(kind="inferencepool", service="llm", namespace="serving")
    assert settings.max_pods == 1024
    with pytest.raises(ValueError, match="port_name"):
        DiscoverySettings(kind="inferencepool", service="llm", port_name="http")
    with pytest.raises(ValueError, match="InferencePool name"):
        DiscoverySettings(kind="inferencepool", service="Not_A_Name")


class FakeApi:
    """The pool object (``pools``: the last one repeats) and the pods' list (``lists``) and watch
    (``watches``: JSON lines each, then closed; none left: idle until the timeout)."""

    def __init__(self) -> None:
        self.pools: list[dict[str, Any]] = []
        self.lists: list[dict[str, Any]] = []
        self.watches: list[list[str]] = []
        self.requests: list[dict[str, str]] = []
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(POOL_PATH, self._pool)
        app.router.add_get(PODS_PATH, self._pods)
        return app

    async def _pool(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"pool": request.match_info["name"]})
        return web.json_response(self.pools[0] if len(self.pools) == 1 else self.pools.pop(0))

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query) | {"namespace": request.match_info["namespace"]}
        self.requests.append(query)
        if query.get("watch") != "true":
            return web.json_response(self.lists[0] if len(self.lists) == 1 else self.lists.pop(0))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        if self.watches:
            for line in self.watches.pop(0):
                await resp.write(line.encode() + b"\n")
        else:
            await asyncio.sleep(min(float(query.get("timeoutSeconds", "1")), 0.5))
        await resp.write_eof()
        return resp

    def clients(self) -> tuple[CoreV1Api, CustomObjectsApi]:
        client = ApiClient(Configuration(host=self.url))
        return CoreV1Api(client), CustomObjectsApi(client)


@pytest.fixture
async def api() -> AsyncIterator[FakeApi]:
    fake = FakeApi()
    running = await start(fake.app(), shutdown_timeout=0.1)
    fake.url = running.url
    try:
        yield fake
    finally:
        await running.stop()


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def pod_list(version: str, *pods: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PodList", "metadata": {"resourceVersion": version}, "items": list(pods)}


def event(kind: str, obj: dict[str, Any], version: str) -> str:
    import json

    obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}
    return json.dumps({"type": kind, "object": obj})


async def test_list_watch_and_a_changed_pool(api: FakeApi, recorder: Any) -> None:
    api.pools = [pool({"app": "vllm"}, [8000]), pool({"app": "vllm"}, [8000]), pool({"app": "vllm"}, [9000])]
    api.lists = [
        pod_list("10", pod("p1", "10.1.0.1"), pod("p2", "10.1.0.2", ready=False)),
        pod_list("20", pod("p1", "10.1.0.1")),
    ]
    api.watches = [[event("MODIFIED", pod("p2", "10.1.0.2"), "11"), event("DELETED", pod("p1", None), "12")]]
    core, custom = api.clients()
    members = Membership(recorder, max_workers=16)
    found = InferencePoolDiscovery(
        core, custom, "serving", "llm", members, watch_timeout_s=1, backoff_initial_s=0.01, backoff_max_s=0.05
    )
    found.start()
    try:
        await wait_until(lambda: members.urls == {"http://10.1.0.1:9000"})
    finally:
        await found.stop()
    assert recorder.calls[:3] == [
        ("add", "http://10.1.0.1:8000"),
        ("add", "http://10.1.0.2:8000"),
        ("remove", "http://10.1.0.1:8000"),
    ]
    pods_queries = [r for r in api.requests if "pool" not in r]
    assert pods_queries[0]["labelSelector"] == "app=vllm" and pods_queries[0]["namespace"] == "serving"
    assert pods_queries[1]["watch"] == "true" and pods_queries[1]["resourceVersion"] == "10"
    assert found.failures == 0 and found.lists == 2  # the new target port relisted


async def test_missing_selector_backs_off_and_keeps_the_workers(api: FakeApi, recorder: Any) -> None:
    api.pools = [pool({"app": "vllm"}, [8000]), pool({}, [8000])]
    api.lists = [pod_list("10", pod("p1", "10.1.0.1"))]
    core, custom = api.clients()
    members = Membership(recorder, max_workers=16)
    found = InferencePoolDiscovery(
        core, custom, "serving", "llm", members, watch_timeout_s=1, backoff_initial_s=0.01, backoff_max_s=0.05
    )
    found.start()
    try:
        await wait_until(lambda: found.failures >= 2)
        assert members.urls == {"http://10.1.0.1:8000"}
    finally:
        await found.stop()


def test_a_pods_role_label_gives_its_workers_their_role() -> None:
    """llm-d's ``llm-d.ai/role`` label: the role of the pod's workers (``docs/disaggregation.md``); an
    unknown value or none leaves them colocated (the template's role)."""
    table = PodTable(4, pool_target(pool({"app": "vllm"}, [8000])))
    labelled = [pod("p", "10.1.0.1"), pod("d", "10.1.0.2"), pod("odd", "10.1.0.3"), pod("plain", "10.1.0.4")]
    for item, role in zip(labelled, ("prefill", "decode", "leader", None), strict=True):
        if role is not None:
            item["metadata"]["labels"]["llm-d.ai/role"] = role
    table.reset(labelled)
    assert (
        table.role_of("http://10.1.0.1:8000") == "prefill"
        and table.role_of("http://10.1.0.2:8000") == "decode"
    )
    assert table.role_of("http://10.1.0.3:8000") is None and table.role_of("http://10.1.0.4:8000") is None
    table.apply("DELETED", labelled[0])
    assert table.role_of("http://10.1.0.1:8000") is None and "p" not in table.pod_roles

    workers = WorkerPool(Router(Config().routing), 8)
    sink = PoolSink(workers)
    sink.role_of = table.role_of
    for url in sorted(table.urls()):
        sink.on_add(url)
    assert {w.name: w.role for w in workers} == {"10.1.0.2:8000": "decode", "10.1.0.3:8000": "both",
                                                  "10.1.0.4:8000": "both"}  # fmt: skip
    assert not workers.disaggregated  # no prefill worker left
