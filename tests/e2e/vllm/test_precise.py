"""Precise mode on real vLLM engines (the package's fleet: two CPU-build instances publishing KV events,
24 blocks of 128 tokens each, ``tests/support/vllm.py``): the router's predictions against the engines'
``cached_tokens`` on chat, tools, multi-turn and salted requests, and eviction under the small cache.
The engine restarted mid-run is ``test_restart.py``'s."""

from __future__ import annotations

from typing import Any

import pytest

from prefix_router.lab.launch.vllm import VllmFleet
from support.routers import RouterFactory
from support.vllm import BLOCK, ask, precise_router, prose

pytestmark = pytest.mark.timeout(600)
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


async def test_predictions_are_the_engines_cached_tokens(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    router = await precise_router(start_router, vllm_fleet)
    rows = []
    conversations = [[{"role": "system", "content": prose(40 + i, 300 + 60 * i)}] for i in range(4)]
    for turn in range(2):
        for i, conv in enumerate(conversations):
            conv.append({"role": "user", "content": f"Question {turn} about parcel {i}?"})
            more: dict[str, Any] = {}
            if i == 1:
                more["tools"] = TOOLS
            if i == 2:
                more["extra_body"] = {"cache_salt": "tenant-2"}
            rows.append(await ask(router, conv, **more))
    salted = [{"role": "system", "content": conversations[2][0]["content"]}, {"role": "user", "content": "?"}]
    rows.append(await ask(router, salted))  # tenant 2's prompt without its salt: none of its blocks
    assert rows[-1][1] == rows[-1][2] == 0, rows[-1]
    assert all(predicted <= prompt for _, predicted, _, prompt in rows)
    assert all(abs(predicted - cached) <= BLOCK for _, predicted, cached, _ in rows), rows
    assert sum(predicted == cached for _, predicted, cached, _ in rows) >= len(rows) - 1, rows
    assert all(cached >= 2 * BLOCK for _, _, cached, _ in rows[4:8]), rows  # the second turns hit
    for worker in router.state.router.precise.workers():
        stats = router.state.router.precise.stats(worker)
        assert stats.orphan_blocks == 0 and stats.block_size_mismatches == 0


async def test_eviction_under_the_small_cache_is_seen(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    router = await precise_router(start_router, vllm_fleet, 0)
    first = [{"role": "system", "content": prose(50, 300)}, {"role": "user", "content": "Hello?"}]
    _, _, _, prompt = await ask(router, first[:])
    held = router.state.router.precise.held_blocks("vllm-0")
    assert held >= prompt // BLOCK
    for i in range(3):  # about 950 tokens (8 blocks) each: with the first, more than the engine's 24
        await ask(
            router, [{"role": "system", "content": prose(60 + i, 900)}, {"role": "user", "content": "Hi?"}]
        )
    stats = router.state.router.precise.stats("vllm-0")
    assert stats.removed_blocks > 0 and stats.unknown_removals == 0
    _, predicted, cached, _ = await ask(router, first[:2])
    assert cached < prompt // BLOCK * BLOCK  # the engine evicted some of the first prompt's blocks
    assert abs(predicted - cached) <= BLOCK, (predicted, cached)
