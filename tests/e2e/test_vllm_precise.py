"""Precise mode on real vLLM engines (``vllm_fleet``: two CPU-build instances with KV events, 64 blocks of
128 tokens each, ``tests/support/vllm.py``): the router's predictions against the engines'
``cached_tokens`` on chat, tools, multi-turn and salted requests; an engine restarted mid-run; eviction
under the small cache. Needs issue 22's fleet (``make vllm``)."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from typing import Any

from prefix_router.lab.launch.vllm import VllmFleet, model_dir
from support.routers import RouterFactory, RouterHandle
from support.vllm import MODEL, workers_config
from support.waiting import wait_until

BLOCK = 128
WORDS = (
    "parcel",
    "route",
    "depot",
    "invoice",
    "customs",
    "pallet",
    "freight",
    "courier",
    "tracking",
    "label",
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find a parcel",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        },
    }
]


def prose(seed: int, words: int) -> str:
    return f"Tenant {seed}. " + " ".join(WORDS[(seed * 7 + i * 5) % len(WORDS)] for i in range(words))


def reset(fleet: VllmFleet) -> None:
    for url in fleet.urls:
        urllib.request.urlopen(urllib.request.Request(f"{url}/reset_prefix_cache", method="POST"), timeout=60)


async def precise_router(start_router: RouterFactory, fleet: VllmFleet, *only: int) -> RouterHandle:
    workers = workers_config(fleet, events=True)
    for worker in workers:
        worker["kv_events"]["model"] = MODEL
    chosen = [workers[i] for i in only] if only else workers
    settings = {
        "routing.policy": "prefix",
        "routing.keys.exact_models": {MODEL: str(model_dir(fleet.settings))},
        "routing.precise.block_tokens": BLOCK,
    }
    router = await start_router(*chosen, settings=settings)
    await asyncio.sleep(1.0)  # the engines' PUB sockets reconnect to the ports this router bound
    return router


async def ask(router: RouterHandle, messages: list[dict[str, Any]], **more: Any) -> tuple[str, int, int, int]:
    """(worker, predicted, cached, prompt) of one request."""
    raw = await router.openai().chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0, **more
    )
    answer = raw.parse()
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    cached = answer.usage.prompt_tokens_details.cached_tokens or 0
    messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    predicted = int(raw.headers["x-prefix-router-prefix-match"])
    return raw.headers["x-prefix-router-worker"], predicted, cached, answer.usage.prompt_tokens


async def settled(router: RouterHandle) -> None:
    """Until the engines' events of the last request have arrived (at most a second)."""
    precise = router.state.router.precise
    before = sum(precise.stats(w).messages for w in precise.workers())
    with contextlib.suppress(AssertionError):  # a full hit stores nothing
        await wait_until(lambda: sum(precise.stats(w).messages for w in precise.workers()) > before, 1.0)


async def test_predictions_are_the_engines_cached_tokens(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    reset(vllm_fleet)
    router = await precise_router(start_router, vllm_fleet)
    rows = []
    conversations = [[{"role": "system", "content": prose(i, 500 + 150 * i)}] for i in range(4)]
    for turn in range(3):
        for i, conv in enumerate(conversations):
            conv.append({"role": "user", "content": f"Question {turn} about parcel {i}?"})
            more: dict[str, Any] = {}
            if i == 1:
                more["tools"] = TOOLS
            if i == 2:
                more["extra_body"] = {"cache_salt": "tenant-2"}
            rows.append(await ask(router, conv, **more))
            await settled(router)
    assert all(predicted <= prompt for _, predicted, _, prompt in rows)
    assert all(abs(predicted - cached) <= BLOCK for _, predicted, cached, _ in rows), rows
    assert sum(predicted == cached for _, predicted, cached, _ in rows) >= len(rows) - 1, rows
    assert sum(cached for _, _, cached, _ in rows) > 0
    for worker in router.state.router.precise.workers():
        stats = router.state.router.precise.stats(worker)
        assert stats.orphan_blocks == 0 and stats.block_size_mismatches == 0


async def test_eviction_under_the_small_cache_is_seen(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    reset(vllm_fleet)
    router = await precise_router(start_router, vllm_fleet, 0)
    first = [{"role": "system", "content": prose(50, 1500)}, {"role": "user", "content": "Hello?"}]
    await ask(router, first[:])
    for i in range(8):  # about 2,000 tokens each: more than the 64 blocks the engine holds
        await ask(
            router, [{"role": "system", "content": prose(60 + i, 1500)}, {"role": "user", "content": "Hi?"}]
        )
        await settled(router)
    _, predicted, cached, _ = await ask(router, first[:2])
    assert router.state.router.precise.stats("vllm-0").removed_blocks > 0
    assert abs(predicted - cached) <= BLOCK, (predicted, cached)


async def test_an_engine_restarted_mid_run_is_not_routed_on_its_old_view(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    reset(vllm_fleet)
    router = await precise_router(start_router, vllm_fleet, 0)
    conv = [{"role": "system", "content": prose(80, 1200)}, {"role": "user", "content": "First?"}]
    await ask(router, conv[:])
    await settled(router)
    precise = router.state.router.precise
    assert precise.held_blocks("vllm-0") > 0
    vllm_fleet.kill(0)
    vllm_fleet.restart(0)
    other = [{"role": "system", "content": prose(81, 300)}, {"role": "user", "content": "New process?"}]
    await ask(router, other)  # the new process's first step publishes: its sequence starts again
    await wait_until(lambda: precise.stats("vllm-0").restarts >= 1, 5.0)
    _, predicted, cached, _ = await ask(router, conv[:2])
    assert cached == 0 and predicted == 0  # the old process's blocks are gone from the view
