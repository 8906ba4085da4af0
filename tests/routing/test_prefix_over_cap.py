"""The ``prefix`` policy when every candidate is over the bounded-load cap (``load_factor`` < 1 makes the
cap bind below the mean): it still chooses, the cheapest of all, and the branch label says whether a
longer match was passed over."""

from __future__ import annotations

import random

from prefix_router.routing.policies import make_policy
from prefix_router.routing.policies.base import load_cap
from prefix_router.routing.policies.prefix import PrefixSettings
from prefix_router.routing.types import Branch, Context, RouteRequest, WorkerSnapshot

TIGHT = PrefixSettings(load_factor=0.5, load_slack=0, hit_cap_factor=1.0)
TOKENS = 4096
BLOCKS = TOKENS // 16


def request() -> RouteRequest:
    return RouteRequest("r", tuple(range(BLOCKS)), 16, TOKENS, 0)


def loaded(*in_flight: int) -> list[WorkerSnapshot]:
    workers = [WorkerSnapshot(f"w{i}", in_flight=n) for i, n in enumerate(in_flight)]
    cap = load_cap(workers, TIGHT.load_factor, TIGHT.load_slack)
    assert all(w.in_flight + 1 > cap for w in workers)  # every one over the cap
    return workers


def select(workers: list[WorkerSnapshot], matches: dict[str, int], seed: int = 0) -> tuple[str, str]:
    decision = make_policy("prefix", TIGHT).select(
        request(), workers, Context(0.0, random.Random(seed), matches)
    )
    return decision.worker, decision.branch


def test_with_every_candidate_over_the_cap_the_least_loaded_is_chosen() -> None:
    for seed in range(8):
        assert select(loaded(2, 2, 3), {}, seed) in {("w0", Branch.LOAD_BALANCE), ("w1", Branch.LOAD_BALANCE)}


def test_over_the_cap_the_holder_of_the_whole_prompt_is_a_prefix_hit() -> None:
    assert select(loaded(2, 2, 3), {"w2": BLOCKS}) == ("w2", Branch.PREFIX_HIT)


def test_over_the_cap_a_short_match_passed_over_is_a_load_fallback() -> None:
    worker, branch = select(loaded(2, 2, 3), {"w2": 1})
    assert worker in {"w0", "w1"} and branch == Branch.LOAD_FALLBACK


def test_over_the_cap_the_longest_match_counts_every_candidate() -> None:
    worker, branch = select(loaded(2, 2, 3), {"w0": 1, "w2": 2})
    assert (worker, branch) == ("w0", Branch.LOAD_FALLBACK)  # w2 matched more: passed over


def test_equal_costs_are_broken_at_random_among_all_of_them() -> None:
    """Workers of equal cost are all candidates, drawn by the rng: over seeds each one is chosen (a tie
    kept as the last or the first one alone would always pick the same), and a cheaper one is never
    passed over for them."""
    idle = [WorkerSnapshot(f"w{i}") for i in range(3)]
    picked = {select(idle, {}, seed)[0] for seed in range(40)}
    assert picked == {"w0", "w1", "w2"}
    busier = [WorkerSnapshot("w0", in_flight=2), WorkerSnapshot("w1"), WorkerSnapshot("w2")]
    assert {select(busier, {}, seed)[0] for seed in range(40)} == {"w1", "w2"}
