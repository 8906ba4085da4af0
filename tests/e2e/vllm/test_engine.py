"""The router in front of real vLLM engines (the CPU build, SmolLM2-135M with its own weights): the
``openai`` client end to end, what the router reads from the engine, and what the engine does with what
the router sends. The package's fleet (``vllm_fleet``, tests/support/vllm.py); each test uses prompts of
its own (``prose(seed, ...)``) so that no test rides on another's cache. The engine restart is
``test_restart.py``'s, last in the package.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from prefix_router.lab.launch.vllm import VllmFleet
from prefix_router.pool import get_adapter, promtext
from support.routers import RouterFactory, RouterHandle
from support.vllm import BLOCK, CACHE_TOKENS, MODEL, chat, post_json, prose, workers_config

pytestmark = pytest.mark.timeout(900)


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        return await response.text()


def generated(metrics: str) -> float:
    """Tokens the engine has generated (``vllm:generation_tokens_total``)."""
    return sum(s.value for s in promtext.parse(metrics, frozenset({"vllm:generation_tokens_total"})))


async def engine_load(url: str) -> Any:
    return get_adapter("vllm").parse_metrics(await get_text(f"{url}/metrics"))


async def router_for(
    start_router: RouterFactory, fleet: VllmFleet, *only: int, **settings: Any
) -> RouterHandle:
    workers = workers_config(fleet)
    chosen = [workers[i] for i in only] if only else workers
    return await start_router(*chosen, settings=settings)


def test_the_package_is_one_pytest_xdist_group(request: pytest.FixtureRequest) -> None:
    """Under ``make pytest``'s two workers the three modules run on one: the package's fleet starts once."""
    groups = [mark.args for mark in request.node.iter_markers("xdist_group")]
    assert groups == [("e2e/vllm",)]


async def test_openai_client_plain_streamed_usage_and_tools(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    router = await router_for(start_router, vllm_fleet)
    client = router.openai()
    body = chat(prose(1, 40), "Say hello.")
    plain = await client.chat.completions.create(**body)
    assert plain.model == MODEL and isinstance(plain.choices[0].message.content, str)
    assert plain.usage is not None and plain.usage.prompt_tokens > 40
    assert plain.usage.prompt_tokens_details is not None
    assert plain.usage.prompt_tokens_details.cached_tokens is not None

    stream = await client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens

    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
    with_tools = await client.chat.completions.create(**chat("You can call tools.", "Weather in Paris?"),
                                                      tools=[tool], tool_choice="auto")  # fmt: skip
    assert with_tools.choices and with_tools.usage is not None

    completion = await client.completions.create(
        model=MODEL, prompt=prose(2, 20), max_tokens=3, temperature=0
    )
    assert completion.choices[0].text is not None and completion.usage is not None


async def test_router_identifies_vllm_and_reads_capacity_and_block_size(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    router = await router_for(start_router, vllm_fleet)
    for worker in router.state.pool:
        assert worker.adapter is not None and worker.adapter.name == "vllm"
        load = await router.state.monitor.scraper.scrape(worker)
        assert load is not None
        assert (load.capacity_tokens, load.block_size) == (CACHE_TOKENS, BLOCK)
        assert worker.learned_capacity == CACHE_TOKENS
        assert router.state.router.engine_block_tokens(worker.name) == BLOCK


async def test_scraping_sees_the_queue_and_kv_usage_under_load(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    # what is under test is what a scrape reads, not its deadline: an API server busy with 16 requests on a
    # loaded 2-core machine once answered every scrape under load past the default 1 s, and only the idle
    # engine's (0, 0) readings came back
    router = await router_for(start_router, vllm_fleet, 0, **{"scrape.timeout_s": 30.0})
    worker = router.state.pool.require("vllm-0")
    url = vllm_fleet.urls[0]
    shared = prose(3, 150)
    # twice the engine's max_num_seqs, 40 tokens each: the second half waits while the first decodes,
    # even when the requests reach a busy engine spread over a second or more (10 requests of 20
    # tokens once went unseen waiting on a loaded machine)
    seqs = vllm_fleet.settings.max_num_seqs
    bodies = [chat(shared, prose(300 + i, 30), max_tokens=40, ignore_eos=True) for i in range(2 * seqs)]
    sends = [asyncio.create_task(post_json(f"{url}/v1/chat/completions", b)) for b in bodies]
    seen: list[Any] = []
    missed = 0
    while not all(s.done() for s in sends):
        load = await router.state.monitor.scraper.scrape(worker)
        if load is not None:
            seen.append(load)
        missed += load is None
        await asyncio.sleep(0.05)
    await asyncio.gather(*sends)
    readings = [(load.queue_depth, load.running) for load in seen], missed  # shown if an assertion fails
    assert max(load.queue_depth for load in seen) >= 1, readings
    assert max(load.running for load in seen) >= 2, readings
    assert max(load.kv_usage for load in seen) > 0.0
    now = router.state.clock()
    snapshot = router.state.router.load.snapshot("vllm-0", now)
    assert snapshot.kv_usage is not None  # the router holds the last scrape


async def test_cached_token_feedback_agrees_with_the_engine(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    router = await router_for(start_router, vllm_fleet, **{"routing.policy": "prefix"})
    client = router.openai()
    system = prose(4, 900)
    answers = []
    for question in ("First question?", "Second question?", "Third question?"):
        raw = await client.chat.completions.with_raw_response.create(**chat(system, question))
        answers.append((raw.headers["x-prefix-router-worker"], raw.parse()))
    workers = {worker for worker, _ in answers}
    assert len(workers) == 1  # the prefix policy keeps a shared system prompt on one engine
    cached = [a.usage.prompt_tokens_details.cached_tokens for _, a in answers]  # type: ignore[union-attr]
    assert cached[0] == 0 and min(cached[1:]) >= 6 * BLOCK and all(c % BLOCK == 0 for c in cached)
    stats = router.state.router.feedback[workers.pop()].as_dict()
    assert stats["reports"] == 3 and stats["agree"] == 3
    assert stats["reported_tokens"] == sum(cached)
    assert 0 <= stats["predicted_tokens"] - stats["reported_tokens"] < 2 * BLOCK  # whole engine blocks


async def test_cache_salt_per_tenant_isolates_the_engine_cache(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    keys = ["tenant-a-key-0001", "tenant-b-key-0002"]
    router = await router_for(
        start_router, vllm_fleet, 0, **{"auth.api_keys": keys, "tenants.cache_salt": True}
    )
    body = chat(prose(5, 400), "Same question?")

    async def cached(key: str) -> int:
        answer = await router.openai(api_key=key).chat.completions.create(**body)
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        return answer.usage.prompt_tokens_details.cached_tokens or 0

    assert await cached(keys[0]) == 0
    assert await cached(keys[0]) >= 256  # the same tenant hits the engine's cache
    assert await cached(keys[1]) == 0  # the other tenant's identical prompt does not
    assert await cached(keys[1]) >= 256


async def test_a_client_disconnect_aborts_the_engine_request(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    router = await router_for(start_router, vllm_fleet, 1)
    url = vllm_fleet.urls[1]
    body = chat(prose(6, 30), "Count to a million.", max_tokens=2500, ignore_eos=True, stream=True)
    async with aiohttp.ClientSession() as http:
        response = await http.post(f"{router.url}/v1/chat/completions", json=body)
        assert response.status == 200
        for _ in range(5):
            await response.content.readline()
        assert (await engine_load(url)).running == 1
        generated_before = generated(await get_text(f"{url}/metrics"))
        response.close()  # the client goes away mid-stream
    started = time.monotonic()
    while (await engine_load(url)).running:
        assert time.monotonic() - started < 15, "the engine kept generating for a client that left"
        await asyncio.sleep(0.2)
    # of the 2,500 asked for (prompt and answer within the 24-block cache's 2,944-token context)
    assert generated(await get_text(f"{url}/metrics")) - generated_before < 1000


async def test_tokenize_and_render_pass_through(vllm_fleet: VllmFleet, start_router: RouterFactory) -> None:
    router = await router_for(start_router, vllm_fleet)
    direct = vllm_fleet.urls[0]
    tokenize = {"model": MODEL, "prompt": prose(7, 25)}
    via_router = await post_json(f"{router.url}/tokenize", tokenize)
    assert via_router == await post_json(f"{direct}/tokenize", tokenize)
    assert via_router["count"] == len(via_router["tokens"]) > 25
    render = chat(prose(8, 25), "Render me.")
    rendered = await post_json(f"{router.url}/v1/chat/completions/render", render)
    assert (
        rendered["token_ids"]
        == (await post_json(f"{direct}/v1/chat/completions/render", render))["token_ids"]
    )
    tokens = await post_json(f"{direct}/tokenize", {"model": MODEL, "messages": render["messages"]})
    assert rendered["token_ids"] == tokens["tokens"]  # the chat template, rendered by the engine
