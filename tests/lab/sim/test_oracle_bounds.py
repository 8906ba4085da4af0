"""The oracle row is the practical ceiling: one LRU cache with the *pooled* capacity of every instance."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("groups", [3, 12])
def test_no_policy_beats_the_pooled_oracle_on_a_trace(tmp_path: Path, groups: int) -> None:
    spec = ClusterSpec(4, get_profile("llama-3.1-8b-h100"), capacity_tokens=4 * 1024)
    report = simulate(trace_scenario(trace(tmp_path / "t.jsonl", groups, rows=200), spec), POLICY_NAMES)
    ceiling = report["oracle"]["hit_rate"]
    for policy, row in report["policies"].items():
        assert row["hit_rate"] <= ceiling + LRU_TOLERANCE, policy


def test_no_policy_beats_the_pooled_oracle_on_conversations() -> None:
    spec = ClusterSpec(3, get_profile("llama-3.1-8b-h100"), capacity_tokens=16_384)
    scenario = workload_scenario("bursty", spec, rate_scale=2.0, limit=150)
    report = simulate(scenario, POLICY_NAMES)
    ceiling = report["oracle"]["hit_rate"]
    assert ceiling < report["oracle"]["ideal_hit_rate"]  # the caches are under pressure
    for policy, row in report["policies"].items():
        assert row["hit_rate"] <= ceiling + LRU_TOLERANCE, policy
