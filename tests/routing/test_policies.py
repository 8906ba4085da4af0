from __future__ import annotations

import random
from collections import Counter

from prefix_router.routing.config import RoutingConfig
from prefix_router.routing.policies import POLICY_NAMES, make_policy
from prefix_router.routing.types import Context, RouteRequest, WorkerSnapshot

CFG = RoutingConfig()


def req(blocks: int = 10, prompt: int = 200, hash_key: int = 1) -> RouteRequest:
    return RouteRequest("r", tuple(range(blocks)), 16, prompt, hash_key)


def snaps(*in_flight: int) -> list[WorkerSnapshot]:
    return [WorkerSnapshot(f"w{i}", in_flight=n) for i, n in enumerate(in_flight)]


def ctx(matches: dict[str, int] | None = None, seed: int = 0) -> Context:
    return Context(0.0, random.Random(seed), matches or {})


def test_every_policy_returns_a_candidate() -> None:
    for name in POLICY_NAMES:
        policy = make_policy(name, CFG)
        for n in (1, 2, 5):
            workers = snaps(*range(n))
            assert policy.select(req(), workers, ctx()).worker in {w.name for w in workers}


def test_random_is_spread_and_respects_weight() -> None:
    policy = make_policy("random", CFG)
    workers = [WorkerSnapshot("a", weight=3.0), WorkerSnapshot("b", weight=1.0)]
    c = ctx()
    counts = Counter(policy.select(req(), workers, c).worker for _ in range(4000))
    assert 2.4 < counts["a"] / counts["b"] < 3.8


def test_round_robin_cycles() -> None:
    policy = make_policy("round_robin", CFG)
    picks = [policy.select(req(), snaps(0, 0, 0), ctx()).worker for _ in range(6)]
    assert picks == ["w0", "w1", "w2", "w0", "w1", "w2"]


def test_least_load_picks_fewest_and_breaks_ties_at_random() -> None:
    policy = make_policy("least_load", CFG)
    assert policy.select(req(), snaps(3, 1, 2), ctx()).worker == "w1"
    picks = {policy.select(req(), snaps(1, 0, 0), ctx(seed=s)).worker for s in range(40)}
    assert picks == {"w1", "w2"}


def test_consistent_hash_is_sticky_and_bounded() -> None:
    policy = make_policy("consistent_hash", CFG)
    first = policy.select(req(hash_key=42), snaps(0, 0, 0, 0), ctx()).worker
    assert all(policy.select(req(hash_key=42), snaps(0, 0, 0, 0), ctx()).worker == first for _ in range(5))
    loads = [0, 0, 0, 0]
    loads[int(first[1:])] = 50  # the owner is far above the bounded-load cap
    overflow = policy.select(req(hash_key=42), snaps(*loads), ctx())
    assert overflow.worker != first and overflow.branch == "hash_overflow"


def test_prefix_prefers_the_longest_match_when_loads_are_equal() -> None:
    policy = make_policy("prefix", CFG)
    d = policy.select(req(), snaps(1, 1, 1), ctx({"w2": 8, "w0": 3}))
    assert (d.worker, d.branch) == ("w2", "prefix_hit")


def test_prefix_spreads_a_hot_prefix_past_the_load_cap() -> None:
    policy = make_policy("prefix", CFG)
    d = policy.select(req(), snaps(12, 0, 0, 0), ctx({"w0": 10}))
    assert d.worker != "w0" and d.branch == "load_fallback"


def test_prefix_without_match_balances_load() -> None:
    policy = make_policy("prefix", CFG)
    d = policy.select(req(), snaps(2, 0, 1), ctx())
    assert (d.worker, d.branch) == ("w1", "load_balance")


def test_prefix_weighs_pending_prefill_against_the_match() -> None:
    policy = make_policy("prefix", CFG)
    busy = [WorkerSnapshot("w0", pending_prefill_tokens=5_000, prefill_backlog=5_000), WorkerSnapshot("w1")]
    assert policy.select(req(prompt=200), busy, ctx({"w0": 10})).worker == "w1"
