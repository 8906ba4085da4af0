"""End to end against simulated engines (``prefix-router engine-sim``, in process): figures simulated."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from prefix_router.lab.sim.server import EngineSimSettings, build_app
from prefix_router.node.life.server import Running, start
from prefix_router.protocol import WORKER_HEADER


@pytest.fixture
async def sim_engine() -> AsyncIterator[Callable[[], Awaitable[Running]]]:
    running: list[Running] = []

    async def make() -> Running:
        handle = await start(build_app(EngineSimSettings(model="sim", time_scale=0.02)), shutdown_timeout=0.2)
        running.append(handle)
        return handle

    try:
        yield make
    finally:
        for handle in running:
            await handle.stop()


async def test_conversation_sticks_to_the_engine_that_caches_it(sim_engine: Any, start_router: Any) -> None:
    engines = [await sim_engine() for _ in range(3)]
    router = await start_router(*[{"url": e.url, "name": f"sim{i}"} for i, e in enumerate(engines)])
    client = router.openai()
    history: list[Any] = [{"role": "system", "content": "You are a careful assistant. " * 60}]
    workers, cached = set(), []
    for turn in range(4):
        history.append({"role": "user", "content": f"question number {turn} " * 5})
        raw = await client.chat.completions.with_raw_response.create(
            model="sim", messages=history, max_tokens=16, stream=turn % 2 == 1,
            stream_options={"include_usage": True} if turn % 2 else None,
        )  # fmt: skip
        workers.add(raw.headers[WORKER_HEADER])
        if turn % 2:
            chunks = [c async for c in raw.parse()]
            reply = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage = next(c.usage for c in chunks if c.usage)
        else:
            completion = raw.parse()
            reply, usage = completion.choices[0].message.content or "", completion.usage
        cached.append(usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0)
        history.append({"role": "assistant", "content": reply})
    assert len(workers) == 1  # prefix affinity across turns, streamed or not
    assert all(c > 0 for c in cached[1:])  # and the engine really served the prefix from its cache
    summary = router.state.router.summary()["workers"]
    assert sum(w["feedback"]["reported_tokens"] for w in summary.values()) == sum(cached)
