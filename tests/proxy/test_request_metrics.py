"""``/metrics`` over real HTTP: ``prefix_router_requests_total`` counts client requests (not attempts) by
worker, model, policy and final status; attempts and retries are counted apart; labels stay bounded
(models the pool knows, policies the router has); the process metrics are exported."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefix_router.protocol import POLICY_HEADER

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


async def test_a_retried_request_is_one_request_and_two_attempts(fake_engine: Any, start_router: Any) -> None:
    broken, good = await fake_engine("broken", status=500), await fake_engine("good")
    router = await start_router(broken, good)
    client = router.openai()
    for _ in range(4):  # round robin: those that try "broken" first are retried on "good"
        await client.chat.completions.create(extra_headers={POLICY_HEADER: "round_robin"}, **CHAT)
    got = await scrape(router.url)
    requests = got["prefix_router_requests_total"]
    assert requests == {(("model", "m"), ("policy", "round_robin"), ("status", "200"), ("worker", "good")): 4}
    attempts = got["prefix_router_upstream_attempts_total"]
    failed = attempts[(("status", "500"), ("worker", "broken"))]
    assert failed >= 1 and attempts[(("status", "200"), ("worker", "good"))] == 4
    assert got["prefix_router_retries_total"][()] == failed


async def test_failed_and_refused_requests_are_counted_once(fake_engine: Any, start_router: Any) -> None:
    router = await start_router(await fake_engine("a", status=500), settings={"retries.max_attempts": 1})
    async with aiohttp.ClientSession() as http:
        for body in (CHAT, {**CHAT, "model": "no-such-model"}, {"model": "m"}):
            async with http.post(router.url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
    requests = (await scrape(router.url))["prefix_router_requests_total"]
    assert requests == {
        (("model", "m"), ("policy", "prefix"), ("status", "500"), ("worker", "a")): 1,
        (("model", "none"), ("policy", "prefix"), ("status", "404"), ("worker", "none")): 1,  # unknown model
        (("model", "none"), ("policy", "none"), ("status", "400"), ("worker", "none")): 1,  # no messages
    }


async def test_labels_stay_bounded_whatever_clients_send(fake_engine: Any, start_router: Any) -> None:
    router = await start_router(await fake_engine("a"))
    async with aiohttp.ClientSession() as http:
        for i in range(30):
            body = {**CHAT, "model": f"model-{i}"}
            headers = {"x-request-id": f"id-{i}", POLICY_HEADER: "prefix"}
            async with http.post(router.url + "/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.status == 404
    requests = (await scrape(router.url))["prefix_router_requests_total"]
    assert len(requests) == 1 and sum(requests.values()) == 30


@pytest.mark.parametrize(
    "name",
    [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ],
)
async def test_process_metrics_are_exported(fake_engine: Any, start_router: Any, name: str) -> None:
    router = await start_router(await fake_engine("a"))
    assert (await scrape(router.url))[name][()] > 0
