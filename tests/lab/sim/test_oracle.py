from __future__ import annotations

from prefix_router.lab.sim.engine import EngineRequest
from prefix_router.lab.sim.oracle import oracle


def req(rid: str, blocks: tuple[int, ...]) -> EngineRequest:
    return EngineRequest(rid, len(blocks) * 16 + 4, 1, blocks)


def test_pooled_cache_counts_reuse_in_arrival_order() -> None:
    reqs = [req("a", (1, 2, 3)), req("b", (1, 2, 3, 4)), req("c", (9,))]
    result = oracle(reqs, capacity_tokens=10_000, block_tokens=16, page=16)
    prompt = sum(r.prompt_tokens for r in reqs)
    assert result.hit_rate == 3 * 16 / prompt
    assert result.ideal_hit_rate == result.hit_rate


def test_small_pooled_cache_loses_to_the_unbounded_one() -> None:
    reqs = [req(f"r{i}", (i % 3 * 100, i % 3 * 100 + 1, i % 3 * 100 + 2)) for i in range(12)]
    small = oracle(reqs, capacity_tokens=4 * 16, block_tokens=16, page=16)
    assert small.hit_rate < small.ideal_hit_rate
    assert small.capacity_tokens == 64


def test_extensions_count_for_later_requests() -> None:
    first = EngineRequest("a", 2 * 16 + 3, 40, (1, 2), (1, 2, 3, 4))
    second = req("b", (1, 2, 3, 4, 5))
    assert oracle([first, second], 10_000, 16, 16).hit_rate == 4 * 16 / (
        first.prompt_tokens + second.prompt_tokens
    )
