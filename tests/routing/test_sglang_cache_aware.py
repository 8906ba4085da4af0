"""The emulation of SGLang's cache_aware policy follows its published algorithm (sgl-router)."""

from __future__ import annotations

import random

import pytest

from prefix_router.routing.index import PrefixIndex
from prefix_router.routing.policies import make_policy, policy_spec
from prefix_router.routing.policies.sglang_cache_aware import SGLangCacheAwarePolicy, SGLangCacheAwareSettings
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Context, RouteRequest, WorkerSnapshot


def policy(**knobs: float) -> SGLangCacheAwarePolicy:
    return SGLangCacheAwarePolicy(SGLangCacheAwareSettings.model_validate(knobs))


def tree(p: SGLangCacheAwarePolicy) -> PrefixIndex:
    assert p.tree is not None
    return p.tree


def req(blocks: tuple[int, ...], prompt: int | None = None, rid: str = "r") -> RouteRequest:
    return RouteRequest(rid, blocks, 16, prompt if prompt is not None else 16 * len(blocks), 0)


def workers(*in_flight: int) -> list[WorkerSnapshot]:
    return [WorkerSnapshot(f"w{i}", in_flight=n) for i, n in enumerate(in_flight)]


def ctx(now: float = 0.0) -> Context:
    return Context(now, random.Random(0))


def test_a_prompt_matched_above_the_threshold_returns_to_its_worker() -> None:
    p = policy()
    first = p.select(req((1, 2, 3, 4)), workers(0, 0, 0), ctx())
    again = p.select(req((1, 2, 3, 4, 5)), workers(0, 0, 0), ctx())  # 80 % matched
    assert (again.worker, again.branch) == (first.worker, "prefix_hit")


def test_a_weak_match_goes_to_the_smallest_tree() -> None:
    p = policy()
    big = p.select(req(tuple(range(100, 120))), workers(0, 0), ctx())
    # 2 of 10 blocks match the big tree (20 % <= 30 %): the other worker, whose tree is empty, gets it
    d = p.select(req((100, 101, 7, 8, 9, 10, 11, 12, 13, 14)), workers(0, 0), ctx())
    assert d.branch == "smallest_tree" and d.worker != big.worker


def test_the_imbalance_gate_needs_both_thresholds() -> None:
    p = policy(balance_abs_threshold=4, balance_rel_threshold=1.5)
    home = p.select(req((1, 2, 3)), workers(0, 0), ctx()).worker
    other = "w1" if home == "w0" else "w0"

    def pick(home_load: int, other_load: int) -> tuple[str, str]:
        snaps = [WorkerSnapshot(home, in_flight=home_load), WorkerSnapshot(other, in_flight=other_load)]
        d = p.select(req((1, 2, 3)), snaps, ctx())
        return d.worker, d.branch

    assert pick(5, 2) == (home, "prefix_hit")  # relative gap, absolute gap 3 <= 4
    assert pick(20, 14) == (home, "prefix_hit")  # absolute gap 6, but 20 <= 1.5 x 14
    assert pick(10, 2) == (other, "load_balance")  # both: the least loaded
    assert tree(p).match((1, 2, 3)) == {home: 3, other: 3}  # the chosen worker's tree learns the prompt


def test_the_tree_remembers_what_was_sent_until_the_periodic_eviction() -> None:
    # max_tree_chars = 64 chars = 16 tokens = one block of 16 tokens per worker
    p = policy(max_tree_chars=64, eviction_interval_s=10.0)
    chosen = p.select(req((1, 2, 3)), workers(0, 0), ctx(now=0.0)).worker
    p.select(req((1, 2, 3)), workers(0, 0), ctx(now=5.0))
    assert tree(p).match((1, 2, 3)) == {chosen: 3}  # not cut back between eviction passes
    p.select(req((9,)), workers(0, 0), ctx(now=11.0))
    assert tree(p).blocks_of(chosen) <= 1


def test_removed_workers_leave_the_tree() -> None:
    p = policy()
    chosen = p.select(req((1, 2, 3)), workers(0, 0), ctx()).worker
    p.on_worker_removed(chosen)
    assert tree(p).match((1, 2, 3)) == {}


def test_it_runs_in_the_router_like_any_policy_and_ignores_sessions() -> None:
    router = Router(RoutingSettings(policy="sglang_cache_aware"), rng=random.Random(0))
    for name in ("a", "b"):
        router.add_worker(name)
    assert policy_spec("sglang_cache_aware").honours_sessions is False
    assert isinstance(make_policy("sglang_cache_aware"), SGLangCacheAwarePolicy)
    r = RouteRequest("1", (1, 2, 3, 4), 16, 64, 0, session="s")
    d = router.route(r, ["a", "b"], 0.0)
    router.dispatched(r, d, 0.0)
    r2 = RouteRequest("2", (1, 2, 3, 4, 5), 16, 80, 0, session="s")
    assert router.route(r2, ["a", "b"], 1.0).worker == d.worker


def test_knobs_have_sglangs_defaults_and_constraints() -> None:
    knobs = SGLangCacheAwareSettings()
    assert (knobs.cache_threshold, knobs.balance_abs_threshold, knobs.balance_rel_threshold) == (0.3, 64, 1.5)
    assert (knobs.eviction_interval_s, knobs.max_tree_chars) == (120.0, 2**26)
    for bad in ({"cache_threshold": 1.5}, {"balance_rel_threshold": 0.5}, {"max_tree_blocks": 0}):
        with pytest.raises(ValueError):
            SGLangCacheAwareSettings.model_validate(bad)
