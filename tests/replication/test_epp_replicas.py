"""Two endpoint pickers, each behind its own real Envoy, sharing their prefix view through Redis
(``--replication``, as for ``serve``): a prefix placed through one gateway is found through the other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from prefix_router.protocol import MATCH_HEADER, WORKER_HEADER
from support.gateway import Gateway, Gateways


async def chat(gateway: Gateway, prompt: str) -> tuple[str, int]:
    client: AsyncOpenAI = gateway.openai()
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": prompt}]
    )
    return raw.headers[WORKER_HEADER], int(raw.headers[MATCH_HEADER])


def replication_stat(gateway: Gateway, name: str) -> float:
    """A ``prefix_router_replication_*`` series of the picker's ``/metrics``."""
    for line in gateway.state.metrics.render().decode().splitlines():
        key, _, value = line.partition(" ")
        if key == f"prefix_router_replication_{name}":
            return float(value)
    raise AssertionError(f"no prefix_router_replication_{name}")


async def test_pickers_share_affinity_through_redis(
    redis_server: Any, fake_engine: Any, kit: Any, tmp_path: Path
) -> None:
    engines = [await fake_engine(name=f"e{i}") for i in range(4)]
    replication = kit.fast_config(url=redis_server.url).model_dump()
    gateways = Gateways(tmp_path)
    try:
        first = await gateways.start(*engines, settings={"replication": replication})
        second = await gateways.start(*engines, settings={"replication": replication})
        assert all(replication_stat(g, "connected") == 1.0 for g in (first, second))
        prompts = [f"document {i}: " + "lorem ipsum dolor sit amet " * 40 for i in range(6)]
        placed = [(await chat(first, p))[0] for p in prompts]
        await kit.wait_until(lambda: replication_stat(first, "outbox_size") == 0)
        sent = replication_stat(first, "sent_changes_total")
        await kit.wait_until(lambda: replication_stat(second, "applied_changes_total") >= sent >= 1)
        names = [e.name for e in engines]
        load = second.state.router.load
        settled = lambda: all(s.in_flight == 0 for s in load.snapshots(names, 0.0))  # noqa: E731
        for prompt, worker in zip(prompts, placed, strict=True):
            await kit.wait_until(settled)  # the first picker's in-flight counts, shared, back to 0
            again, predicted = await chat(second, prompt + " and one more question")
            assert again == worker and predicted > 0
        assert len(set(placed)) > 1
    finally:
        await gateways.close()
