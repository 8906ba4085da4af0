"""The dashboard's document and the admin decision feed over HTTP: bounded whatever the fleet (64
workers, thousands of prefixes), the feed's query checked, and a prediction's path through a served
request (the access log's ``predicted_ttft_ms``, the prediction-error metric, the feed)."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
import pytest

from prefix_router.node.config import load_config
from prefix_router.node.control.dashboard import board as board_module
from prefix_router.node.control.dashboard.board import Board
from prefix_router.node.state import STATE
from prefix_router.proxy.run.app import create_app
from prefix_router.routing import Decision, RouteRequest
from support.routers import QUIET, UpFetcher

ADMIN = "admin-token-dashboard-3e1a"


class Predicting:
    """A policy's decisions with a predicted first-token time of 4.2 ms."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def select(self, req: RouteRequest, workers: Any, ctx: Any) -> Decision:
        decision: Decision = self.inner.select(req, workers, ctx)
        decision.predicted_ttft_s = 0.0042
        return decision

    def on_worker_removed(self, worker: str) -> None:
        self.inner.on_worker_removed(worker)


def test_the_document_is_bounded_with_64_workers_and_thousands_of_prefixes() -> None:
    workers = [{"url": f"http://10.0.{i // 200}.{i % 200}:8000", "name": f"gpu-{i}"} for i in range(64)]
    config = load_config(env={}, overrides={**QUIET, "workers": workers, "auth.admin_token": ADMIN})
    state = create_app(config, fetcher=UpFetcher())[STATE]
    now = state.clock()
    for i in range(5000):  # 5000 requests over 3000 prefixes, all over the fleet
        blocks = tuple(range(i % 3000 * 100, i % 3000 * 100 + 8))
        req = RouteRequest(f"r{i}", blocks, 16, 128, hash_key=blocks[0], namespace=1 + i % 40)
        decision = state.router.route(req, [f"gpu-{i % 64}"], now)
        state.router.dispatched(req, decision, now)
        state.decisions.add(now, "prefix", decision, req)
    state.router.add_event_worker("gpu-3", "m")  # an event-fed view (precise mode)
    doc = Board(state).document(now)
    assert len(doc["workers"]) == 64
    views = {w["name"]: w["precise"] for w in doc["workers"]}
    assert views["gpu-3"]["state"] == "fresh" and views["gpu-3"]["lag_ms"] is None  # no event yet
    assert views["gpu-2"] is None
    assert len(doc["prefixes"]) == board_module.PREFIXES_SHOWN
    assert len(doc["decisions"]) == board_module.DECISIONS_SHOWN
    assert all(p["holders"] and p["requests"] >= 1 for p in doc["prefixes"])
    assert len(orjson.dumps(doc)) < 256 * 1024  # what one poll carries


async def test_admin_decisions_checks_its_query(start_router: Any, fake_engine: Any) -> None:
    router = await start_router(await fake_engine("a"), settings={"auth.admin_token": ADMIN})
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as http:
        for i in range(5):
            body = {"model": "m", "messages": [{"role": "user", "content": f"hello {i} " * 30}]}
            async with http.post(router.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
        async with http.get(router.url + "/admin/decisions?limit=2", headers=headers) as resp:
            got = await resp.json()
        assert got["total"] == 5 and [d["seq"] for d in got["decisions"]] == [3, 4]
        async with http.get(router.url + "/admin/decisions?after=1&limit=99999", headers=headers) as resp:
            assert [d["seq"] for d in (await resp.json())["decisions"]] == [2, 3, 4]
        async with http.get(router.url + "/admin/decisions?limit=many", headers=headers) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_query"


async def test_a_prediction_reaches_the_access_log_the_metrics_and_the_feed(
    start_router: Any, fake_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The routing core's prediction (a policy that predicts sets ``predicted_ttft_s``: here the
    configured policy's decisions given one) goes through the served request to every place an operator
    reads it."""
    router = await start_router(await fake_engine("a"), settings={"auth.admin_token": ADMIN})
    policies = router.state.router.policies
    name = router.state.config.routing.policy
    policies[name] = Predicting(policies[name])
    caplog.set_level(logging.INFO, logger="prefix_router.access")
    async with aiohttp.ClientSession() as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "hello " * 30}]}
        async with http.post(router.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
        async with http.get(router.url + "/metrics") as resp:
            text = await resp.text()
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with http.get(router.url + "/admin/decisions", headers=headers) as resp:
            [entry] = (await resp.json())["decisions"]
    assert "predicted_ttft_ms=4.2 " in caplog.text
    assert 'prefix_router_ttft_prediction_error_count{worker="a"} 1.0' in text
    assert entry["predicted_ttft_ms"] == 4.2 and entry["observed_ttft_ms"] > 0 and entry["status"] == 200
