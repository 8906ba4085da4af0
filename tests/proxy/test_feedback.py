"""Engine feedback and aborts through the real HTTP proxy (issue 12, table rows 4 and 5), and the
predicted-vs-reported view in ``/admin/routing`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from support.bodies import ask
from support.client import routed
from support.waiting import wait_until

TOKEN = "admin-token-for-feedback-tests"
SYSTEMS = [f"system prompt number {i}. " + "Answer like a careful librarian would. " * 100 for i in range(5)]


def chat(system: str, question: str = "hello?", stream: bool = False) -> dict[str, Any]:
    return ask(question, system, stream=stream)


async def predicted(url: str, body: dict[str, Any]) -> int:
    """Send ``body`` (not streamed) and return the router's prediction for it."""
    return (await routed(url, body))[1]


async def admin_routing(url: str) -> Any:
    async with aiohttp.ClientSession() as http:
        resp = await http.get(url + "/admin/routing", headers={"Authorization": f"Bearer {TOKEN}"})
        assert resp.status == 200
        return orjson.loads(await resp.read())["summary"]


async def metric_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as http:
        text = await (await http.get(url + "/metrics")).text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_one_report_of_no_cached_tokens_wipes_no_other_prefix(
    fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("a")  # reports nothing until told
    router = await start_router(engine, settings={"auth.admin_token": TOKEN})
    for system in SYSTEMS:  # five prefixes on the only worker
        await predicted(router.url, chat(system))
    latest = "a sixth system prompt. " + "Be brief. " * 400
    await predicted(router.url, chat(latest))
    engine.b.cached_tokens = 0  # e.g. a reasoning turn, or a prediction rounded down by the engine
    assert await predicted(router.url, chat(latest, "another question")) > 900
    engine.b.cached_tokens = None
    again = [await predicted(router.url, chat(system, "a third question")) for system in SYSTEMS]
    assert all(p > 900 for p in again), again  # every other prefix is still predicted whole

    summary = await admin_routing(router.url)
    worker = summary["workers"]["a"]
    feedback = worker["feedback"]
    assert (feedback["reports"], feedback["miss"], feedback["reported_tokens"]) == (1, 1, 0)
    assert feedback["predicted_tokens"] > 900 and feedback["unreported"] == 11
    # one bounded step (in blocks, worth what the engine usage taught the units: within a block in tokens)
    step = worker["known_capacity_tokens"] * 9 // 10
    assert abs(worker["capacity_tokens"] - step) <= worker["block_tokens"], (worker, step)
    got = await metric_samples(router.url)
    assert got[("prefix_router_cache_reports_total", (("verdict", "miss"), ("worker", "a")))] == 1
    assert got[("prefix_router_cached_tokens_total", (("kind", "reported"), ("worker", "a")))] == 0
    predicted_total = got[("prefix_router_cached_tokens_total", (("kind", "predicted"), ("worker", "a")))]
    assert predicted_total == feedback["predicted_tokens"]  # the reported request only


async def test_a_request_racing_its_prefixs_first_prefill_changes_nothing(
    fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("a")
    router = await start_router(engine, settings={"auth.admin_token": TOKEN})
    await predicted(router.url, chat(SYSTEMS[0]))  # an older prefix on the worker
    engine.b.delay_s, engine.b.cached_tokens = 1.5, 0  # the engine is still computing the first one ...
    first = asyncio.create_task(predicted(router.url, chat(SYSTEMS[1])))
    await wait_until(lambda: len(engine.generations) == 2)
    racer = await predicted(router.url, chat(SYSTEMS[1], "same prefix, sent meanwhile"))
    assert racer > 900 and await first == 0  # ... so it reports 0 for the second: not a miss
    engine.b.delay_s, engine.b.cached_tokens = 0.0, None
    assert await predicted(router.url, chat(SYSTEMS[0], "again")) > 900
    worker = (await admin_routing(router.url))["workers"]["a"]
    assert (worker["feedback"]["raced"], worker["feedback"]["miss"]) == (1, 0)
    assert worker["capacity_tokens"] == worker["known_capacity_tokens"]


async def test_a_client_aborting_a_stream_after_the_first_token_keeps_the_prompts_blocks(
    fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("a", chunks=20, chunk_delay_s=0.2)
    router = await start_router(engine)
    body = chat(SYSTEMS[0], stream=True)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(router.url + "/v1/chat/completions", json=body)
        assert resp.status == 200 and await resp.content.readany()  # the first token arrived
        resp.close()  # the client hangs up mid-stream
    await asyncio.wait_for(engine.cancelled.wait(), 5.0)
    await wait_until(lambda: router.state.router.load.tracked() == 0)
    engine.b.chunk_delay_s = 0.0
    # the engine computed it: about 975 nominal tokens, valued at half before the model's first report
    # (a streamed answer without usage: FIRST_CHARS_PER_TOKEN)
    assert await predicted(router.url, chat(SYSTEMS[0], "a follow-up")) > 450


async def test_a_stream_cut_by_the_engine_after_the_first_token_keeps_the_prompts_blocks(
    fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("a", chunks=5, die_after_chunks=1)
    router = await start_router(engine)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(router.url + "/v1/chat/completions", json=chat(SYSTEMS[1], stream=True))
        assert resp.status == 200
        assert b"upstream_" in await resp.read()  # the stream ends with an error event
    engine.b.die_after_chunks = None
    assert await predicted(router.url, chat(SYSTEMS[1], "a follow-up")) > 450  # as above


async def test_failures_before_the_first_token_still_trim(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a", status=400)  # the engine refuses: it computed nothing
    router = await start_router(engine)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(router.url + "/v1/chat/completions", json=chat(SYSTEMS[2]))
        assert resp.status == 400
        await resp.read()
        engine.b.status, engine.b.hang = 200, True  # now it never answers; the client gives up
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(http.post(router.url + "/v1/chat/completions", json=chat(SYSTEMS[3])), 0.5)
    await wait_until(lambda: router.state.router.load.tracked() == 0)
    engine.b.hang = False
    assert await predicted(router.url, chat(SYSTEMS[2], "again")) == 0
    assert await predicted(router.url, chat(SYSTEMS[3], "again")) == 0
