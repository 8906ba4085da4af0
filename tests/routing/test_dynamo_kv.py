"""The dynamo_kv emulation: Dynamo's documented cost, prefill blocks weighed against active blocks."""

from __future__ import annotations

import random
from collections import Counter

from prefix_router.routing.policies.dynamo_kv import DynamoKvPolicy, DynamoKvSettings
from prefix_router.routing.types import Branch, Context, RouteRequest, WorkerSnapshot


def request(blocks: int = 10) -> RouteRequest:
    return RouteRequest("r", tuple(range(blocks)), 16, blocks * 16, 1)


def test_the_holder_wins_while_its_active_blocks_cost_less_than_a_prefill() -> None:
    policy = DynamoKvPolicy(DynamoKvSettings())
    workers = [WorkerSnapshot("a"), WorkerSnapshot("b")]
    ctx = Context(0.0, random.Random(0), {"a": 8})
    assert policy.select(request(), workers, ctx).worker == "a"  # 2 against 10 blocks
    busy = [WorkerSnapshot("a", in_flight=1), WorkerSnapshot("b")]  # 2 + 10 active against 10
    decision = policy.select(request(), busy, ctx)
    assert decision.worker == "b" and decision.branch == Branch.LOAD_FALLBACK


def test_the_overlap_weight_scales_the_prefill() -> None:
    policy = DynamoKvPolicy(DynamoKvSettings(overlap_score_weight=4.0))
    policy.select(request(), [WorkerSnapshot("a")], Context(0.0, random.Random(0)))  # a's mean: 10 blocks
    busy = [WorkerSnapshot("a", in_flight=1), WorkerSnapshot("b")]  # 4 x 2 + 10 against 4 x 10
    assert policy.select(request(), busy, Context(0.0, random.Random(0), {"a": 8})).worker == "a"


def test_a_temperature_samples_and_zero_takes_the_lowest() -> None:
    workers = [WorkerSnapshot("a"), WorkerSnapshot("b")]
    ctx = Context(0.0, random.Random(1), {"a": 8})
    greedy = DynamoKvPolicy(DynamoKvSettings())
    assert {greedy.select(request(), workers, ctx).worker for _ in range(50)} == {"a"}
    warm = DynamoKvPolicy(DynamoKvSettings(temperature=1.0))
    counts = Counter(warm.select(request(), workers, ctx).worker for _ in range(2000))
    assert counts["a"] > counts["b"] > 0  # e^0 against e^-1: about 73 % on a


def test_a_removed_worker_s_mean_goes() -> None:
    policy = DynamoKvPolicy(DynamoKvSettings())
    policy.select(request(30), [WorkerSnapshot("a")], Context(0.0, random.Random(0)))
    policy.on_worker_removed("a")
    assert policy.logit(request(), WorkerSnapshot("a", in_flight=1), Context(0.0, random.Random(0))) == 20
