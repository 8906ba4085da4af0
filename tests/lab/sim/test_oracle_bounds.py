"""The oracle row is the practical ceiling: one LRU cache with the *pooled* capacity of every instance."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from prefix_router.lab.sim.engine import EngineRequest
from prefix_router.lab.sim.oracle import oracle
from prefix_router.lab.sim.profiles import get_profile
from prefix_router.lab.sim.run import simulate, trace_scenario, workload_scenario
from prefix_router.lab.sim.simulator import ClusterSpec
from prefix_router.protocol import MOONCAKE_BLOCK_TOKENS as TRACE_BLOCK_TOKENS
from prefix_router.routing.policies import POLICY_NAMES

LRU_TOLERANCE = 0.01  # separate LRU caches can beat one pooled LRU by a hair (LRU is not optimal)


def trace(path: Path, groups: int, rows: int, seed: int = 0) -> Path:
    """Requests over ``groups`` shared 3-block prefixes (1,536 tokens each) plus a private block."""
    rng = random.Random(seed)
    lines = []
    for i in range(rows):
        g = rng.randrange(groups)
        ids = [g * 100 + b for b in range(3)] + [10_000 + i]
        lines.append({"timestamp": i * 400, "input_length": 4 * 512, "output_length": 8, "hash_ids": ids})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_the_oracle_uses_the_pooled_capacity_of_every_instance(tmp_path: Path) -> None:
    # 8 prefixes of 1,536 tokens: one instance (4,096 tokens) holds two, the four together hold all
    spec = ClusterSpec(4, get_profile("llama-3.1-8b-h100"), capacity_tokens=4 * 1024)
    scenario = trace_scenario(trace(tmp_path / "t.jsonl", groups=8, rows=160), spec)
    report = simulate(scenario, ["prefix"])
    assert report["oracle"]["capacity_tokens"] == 4 * 4 * 1024
    arrivals = [r.engine for r in scenario.make_source().initial()]
    page = spec.profile.block_size
    pooled = oracle(arrivals, 4 * 4 * 1024, TRACE_BLOCK_TOKENS, page)
    single = oracle(arrivals, 4 * 1024, TRACE_BLOCK_TOKENS, page)
    assert report["oracle"]["hit_rate"] == pytest.approx(pooled.hit_rate)
    assert report["oracle"]["hit_rate"] > single.hit_rate + 0.2  # the pooled cache holds all 8 prefixes


def optimal_hit_rate(requests: Sequence[EngineRequest], capacity_blocks: int, page: int) -> float:
    """A strict ceiling: one cache of ``capacity_blocks`` that knows the future (Belady's rule, a block
    left out where its next use is the farthest) and counts every block it holds as a hit, not only a
    leading run. Separate caches of the same total size are one of the ways it could be used."""
    accesses = [b for r in requests for b in r.blocks]
    never = len(accesses)
    next_use = [never] * len(accesses)
    seen: dict[int, int] = {}
    for i in range(len(accesses) - 1, -1, -1):
        next_use[i] = seen.get(accesses[i], never)
        seen[accesses[i]] = i
    held: dict[int, int] = {}  # block -> its next use
    position = cached = prompt = 0
    for r in requests:
        hits = 0
        for block in r.blocks:
            upcoming = next_use[position]
            position += 1
            if block in held or len(held) < capacity_blocks:
                hits += block in held
                held[block] = upcoming
                continue
            farthest = max(held, key=held.__getitem__)
            if held[farthest] > upcoming:
                del held[farthest]
                held[block] = upcoming
        cached += min(hits * TRACE_BLOCK_TOKENS, (r.prompt_tokens - 1) // page * page)
        prompt += r.prompt_tokens
    return cached / prompt


@pytest.mark.parametrize("groups", [3, 12])
def test_no_policy_beats_a_cache_of_the_pooled_size_that_knows_the_future(
    tmp_path: Path, groups: int
) -> None:
    """The LRU oracle is a practical ceiling only: with 12 groups, separate LRU caches holding 3 groups
    each (a static partition) keep 46.6 % of the prompt tokens, one pooled LRU 44.75 %."""
    spec = ClusterSpec(4, get_profile("llama-3.1-8b-h100"), capacity_tokens=4 * 1024)
    scenario = trace_scenario(trace(tmp_path / "t.jsonl", groups, rows=200), spec)
    report = simulate(scenario, POLICY_NAMES)
    arrivals = [r.engine for r in scenario.make_source().initial()]
    ceiling = optimal_hit_rate(arrivals, 4 * 4 * 1024 // TRACE_BLOCK_TOKENS, spec.profile.block_size)
    assert report["oracle"]["hit_rate"] <= ceiling
    for policy, row in report["policies"].items():
        assert row["hit_rate"] <= ceiling, policy


def test_the_optimal_ceiling_counts_what_a_cache_that_knows_the_future_keeps() -> None:
    """a b c a b: with two blocks of room Belady keeps a and b (c is never used again), 2 hits of 5 (LRU:
    none); with one, it keeps a, whose next use is the nearest, 1 hit."""
    requests = [EngineRequest(str(i), TRACE_BLOCK_TOKENS + 1, 1, (b,)) for i, b in enumerate((1, 2, 3, 1, 2))]
    per_hit = TRACE_BLOCK_TOKENS / (5 * (TRACE_BLOCK_TOKENS + 1))
    assert optimal_hit_rate(requests, 2, 16) == pytest.approx(2 * per_hit)
    assert optimal_hit_rate(requests, 1, 16) == pytest.approx(per_hit)


def test_no_policy_beats_the_pooled_oracle_on_conversations() -> None:
    spec = ClusterSpec(3, get_profile("llama-3.1-8b-h100"), capacity_tokens=16_384)
    scenario = workload_scenario("bursty", spec, rate_scale=2.0, limit=150)
    report = simulate(scenario, POLICY_NAMES)
    ceiling = report["oracle"]["hit_rate"]
    assert ceiling < report["oracle"]["ideal_hit_rate"]  # the caches are under pressure
    for policy, row in report["policies"].items():
        assert row["hit_rate"] <= ceiling + LRU_TOLERANCE, policy
