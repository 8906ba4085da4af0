"""The ``prefix`` policy's promises: the bounded-load cap binds even for long, fully matched prompts, and
the holder of a prefix is left only when its wait clearly exceeds the recomputation."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefix_router.routing.policies import make_policy
from prefix_router.routing.policies.base import load_cap
from prefix_router.routing.policies.prefix import PrefixKnobs, delayed_requests
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Context, Outcome, RouteRequest, WorkerSnapshot

CFG = PrefixKnobs()
LONG = 20_000  # tokens: recomputing this prompt costs far more than any in-flight penalty
BLOCKS = LONG // 16


def long_request(rid: str = "r") -> RouteRequest:
    return RouteRequest(rid, tuple(range(BLOCKS)), 16, LONG, 0)


def snaps(*in_flight: int) -> list[WorkerSnapshot]:
    return [WorkerSnapshot(f"w{i}", in_flight=n) for i, n in enumerate(in_flight)]


class Caches:
    """The index's view of the caches: every cache ``fill`` full."""

    def __init__(self, fill: float) -> None:
        self.level = fill

    def fill(self, worker: str) -> float:
        return self.level


def ctx(matches: dict[str, int], fill: float = 1.0, request_work: float = 0.0) -> Context:
    return Context(0.0, random.Random(0), matches, Caches(fill), request_work)


def test_a_long_fully_matched_prompt_leaves_a_holder_at_the_cap() -> None:
    policy = make_policy("prefix")
    workers = snaps(4, 0, 0, 0)
    assert workers[0].in_flight + 1 > load_cap(workers, CFG.load_factor, CFG.load_slack)  # at the cap
    d = policy.select(long_request(), workers, ctx({"w0": BLOCKS}))
    assert d.worker != "w0" and d.branch == "load_fallback"


def test_the_cap_boundary_one_below_it_still_takes_the_request() -> None:
    policy = make_policy("prefix")
    workers = snaps(3, 0, 0, 0)  # cap = ceil(1.25 x 4 / 4) + 2 = 4: the holder may take a 4th request
    assert workers[0].in_flight + 1 == load_cap(workers, CFG.load_factor, CFG.load_slack)
    d = policy.select(long_request(), workers, ctx({"w0": BLOCKS}))
    assert (d.worker, d.branch) == ("w0", "prefix_hit")


def test_the_holder_is_left_only_when_its_wait_exceeds_twice_the_recomputation() -> None:
    policy = make_policy("prefix")
    # recomputing 20,000 tokens elsewhere is 26,103 token-equivalents; x2 on a full cache
    stays = [WorkerSnapshot("w0", prefill_backlog=45_000), WorkerSnapshot("w1")]
    leaves = [WorkerSnapshot("w0", prefill_backlog=60_000), WorkerSnapshot("w1")]
    assert policy.select(long_request(), stays, ctx({"w0": BLOCKS})).worker == "w0"
    assert policy.select(long_request(), leaves, ctx({"w0": BLOCKS})).worker == "w1"


def test_a_cache_with_room_costs_only_the_recomputation() -> None:
    policy = make_policy("prefix")
    workers = [WorkerSnapshot("w0", prefill_backlog=45_000), WorkerSnapshot("w1")]
    assert policy.select(long_request(), workers, ctx({"w0": BLOCKS}, fill=0.0)).worker == "w1"


def test_a_saturated_fleet_sticks_harder() -> None:
    policy = make_policy("prefix")
    # the wait that made the holder lose above, but the fleet's backlog is three typical requests deep
    workers = [WorkerSnapshot("w0", prefill_backlog=60_000), WorkerSnapshot("w1")]
    saturated = ctx({"w0": BLOCKS}, request_work=10_000)
    assert policy.select(long_request(), workers, saturated).worker == "w0"
    plain = make_policy("prefix", PrefixKnobs(saturation_weight=0.0))
    assert plain.select(long_request(), workers, saturated).worker == "w1"


def test_the_delayed_requests_grow_without_bound_with_the_queue() -> None:
    values = [delayed_requests(w) for w in (0.0, 0.5, 1.0, 2.0, 5.0, 10.0)]
    assert values[0] == 0.0 and values == sorted(values)
    assert values[1] == pytest.approx(1.0)  # rho = 0.5
    assert values[-1] > 10 * 10


@settings(max_examples=40, deadline=None)
@given(
    workers=st.integers(min_value=2, max_value=8),
    events=st.lists(
        st.tuples(st.booleans(), st.integers(min_value=0, max_value=10_000)), min_size=1, max_size=120
    ),
)
def test_no_worker_ever_exceeds_the_cap_under_one_hot_long_prefix(
    workers: int, events: list[tuple[bool, int]]
) -> None:
    """Requests that all share one long prefix arrive and finish in any order: the worker chosen for each
    is under the bounded-load cap computed over every worker just before the decision."""
    router = Router(RoutingSettings(), rng=random.Random(1))
    names = [f"w{i}" for i in range(workers)]
    for name in names:
        router.add_worker(name)
    live: list[tuple[RouteRequest, str]] = []
    for step, (arrive, pick) in enumerate(events):
        if not arrive and live:
            done, worker = live.pop(pick % len(live))
            router.finished(done, worker, Outcome(True, LONG), float(step))
            continue
        req = RouteRequest(f"r{step}", tuple(range(BLOCKS)), 16, LONG + step, 0)
        before = router.load.snapshots(names, float(step))
        cap = load_cap(before, CFG.load_factor, CFG.load_slack)
        decision = router.route(req, names, float(step))
        chosen = next(s for s in before if s.name == decision.worker)
        assert chosen.in_flight + 1 <= cap, (decision, [s.in_flight for s in before], cap)
        router.dispatched(req, decision, float(step))
        live.append((req, decision.worker))
