"""The ttft policy: constructed cases of its prediction, and its choice always a candidate under the cap."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefix_router.routing.latency import LatencyModel, predict
from prefix_router.routing.policies import make_policy
from prefix_router.routing.policies.base import load_cap, under_cap
from prefix_router.routing.policies.ttft import (
    HOMES_MEMORY,
    TtftPolicy,
    TtftSettings,
    eviction_chain,
    occupancy,
)
from prefix_router.routing.types import MAX_ESTIMATES, Branch, Context, RouteRequest, WorkerSnapshot

CPU = (0.03, 1e-3, 2e-3, 0.0)  # 1,000 tokens/s, admission never waits


def request() -> RouteRequest:
    return RouteRequest("r", tuple(range(60)), 16, 960, 1)  # 960 tokens, 60 blocks


def learned(rates: dict[str, tuple[float, float, float, float]]) -> LatencyModel:
    """A model whose workers learned ``rates`` from a seeded synthetic sequence."""
    model = LatencyModel(1000)
    model.rates("a", TtftPolicy(TtftSettings()).prior)  # read, as a router's policy does: errors count
    rng = random.Random(0)
    for worker, r in rates.items():
        for i in range(200):
            work, decoding, queued = rng.uniform(10, 3000), rng.randrange(0, 9), rng.randrange(0, 4)
            model.dispatched(f"{worker}{i}", worker, work, decoding, 0.0, queued)
            model.observed(f"{worker}{i}", predict(r, work, decoding, queued))
    return model


def context(matches: dict[str, int], model: LatencyModel | None) -> Context:
    return Context(0.0, random.Random(0), matches, fills={"a": 1.0, "b": 1.0}, latency=model)


def test_the_holder_wins_while_its_first_token_comes_sooner() -> None:
    """The holder has four requests decoding short replies: staying costs a few steps of them, moving
    recomputes 960 tokens (and evicts as much there)."""
    policy = TtftPolicy(TtftSettings())
    workers = [WorkerSnapshot("a", in_flight=4, decoding=4), WorkerSnapshot("b")]
    decision = policy.select(request(), workers, context({"a": 58}, learned({"a": CPU, "b": CPU})))
    assert decision.worker == "a" and decision.branch == Branch.PREFIX_HIT


def test_a_queue_on_the_holder_sends_the_request_elsewhere() -> None:
    """Five seconds of prefill queued on the holder: recomputing the prefix on the other worker, whose
    cache has room, is faster (with both caches full, what the copy evicts would set off a chain of
    recomputes: ``test_a_queue_worth_a_move_in_a_roomy_fleet_is_not_in_a_full_one``)."""
    policy = TtftPolicy(TtftSettings())
    workers = [WorkerSnapshot("a", in_flight=5, prefill_backlog=5000.0), WorkerSnapshot("b")]
    model = learned({"a": CPU, "b": CPU})
    ctx = Context(0.0, random.Random(0), {"a": 58}, fills={"a": 1.0, "b": 0.3}, latency=model)
    decision = policy.select(request(), workers, ctx)
    assert decision.worker == "b" and decision.branch == Branch.LOAD_FALLBACK


def test_a_faster_engine_is_worth_a_miss_only_when_it_is_much_faster() -> None:
    policy = TtftPolicy(TtftSettings())
    workers = [WorkerSnapshot("a"), WorkerSnapshot("b")]
    same = learned({"a": CPU, "b": (0.03, 0.8e-3, 2e-3, 0.0)})
    assert policy.select(request(), workers, context({"a": 58}, same)).worker == "a"
    fast = learned({"a": (0.03, 5e-3, 2e-3, 0.0), "b": (0.03, 1e-4, 2e-3, 0.0)})  # 50x faster prefill
    assert policy.select(request(), workers, context({"a": 58}, fast)).worker == "b"


def test_without_a_model_it_uses_the_prior() -> None:
    policy = make_policy("ttft")
    workers = [WorkerSnapshot("a", in_flight=2, decoding=2), WorkerSnapshot("b")]
    assert policy.select(request(), workers, context({"a": 58}, None)).worker == "a"
    assert policy.select(request(), workers, context({}, None)).worker == "b"  # no match: the idle one


class Caches:
    """The index's view of two caches of 4,096 tokens: ``a`` full, ``b`` with room for one prefix."""

    def __init__(self) -> None:
        self.fills = {"a": 1.0, "b": 0.7}

    def fill(self, worker: str) -> float:
        return self.fills.get(worker, 0.0)

    def capacity_tokens(self, worker: str) -> int:
        return 4096


def test_a_new_prefix_goes_where_it_evicts_nothing() -> None:
    """Nobody holds the prompt: the full cache is a little less busy, but a copy there evicts 960 tokens
    that are recomputed later; the other has room for it, priced at the share of its cache in use (the
    room is shared by what comes next)."""
    policy = TtftPolicy(TtftSettings())
    workers = [WorkerSnapshot("a", in_flight=1, decoding=1), WorkerSnapshot("b", in_flight=2, decoding=2)]
    caches = Caches()
    model = learned({"a": CPU, "b": CPU})
    ctx = Context(0.0, random.Random(0), {}, caches, fills=caches.fills, latency=model)
    decision = policy.select(request(), workers, ctx)
    assert decision.worker == "b" and decision.branch == Branch.LOAD_BALANCE
    by_worker = {e.worker: e for e in decision.estimates}
    a, b = by_worker["a"], by_worker["b"]
    # all 960 tokens evicted, recomputed where there is room, and where there is none evicting in turn: the
    # roomiest cache is 70 % full, so the chain is 1 / 0.3, at most one recompute per worker: 2
    assert a.cache_s == pytest.approx(2 * a.prefill_s, rel=0.05)
    assert b.cache_s == pytest.approx(0.7 * a.cache_s, rel=0.01)  # they fit: the share in use


def test_running_requests_take_room_the_index_does_not_see() -> None:
    """The index says ``b`` has room, but the engine's scraped KV usage says its running requests hold
    95 % of it: a copy there evicts as on a full cache, and the holder of half the prompt wins."""
    policy = TtftPolicy(TtftSettings())
    caches = Caches()
    caches.fills = {"a": 1.0, "b": 0.2}
    model = learned({"a": CPU, "b": CPU})
    free = [WorkerSnapshot("a", in_flight=2, decoding=1), WorkerSnapshot("b", in_flight=1, decoding=1)]
    ctx = Context(0.0, random.Random(0), {"a": 30}, caches, fills=caches.fills, latency=model)
    assert policy.select(request(), free, ctx).worker == "b"
    busy = [free[0], WorkerSnapshot("b", in_flight=1, decoding=1, kv_usage=0.95)]
    decision = policy.select(request(), busy, ctx)
    assert decision.worker == "a"
    by_worker = {e.worker: e for e in decision.estimates}
    assert by_worker["b"].cache_s > by_worker["a"].cache_s


def test_a_full_engine_s_admission_queue_counts_in_its_wait() -> None:
    """Both hold the prompt; ``a``'s engine is full (each request queued ahead waits 300 ms for a slot),
    ``b``'s never is: three requests queued on each, the request goes to ``b``."""
    policy = TtftPolicy(TtftSettings())
    full = (0.03, 1e-3, 2e-3, 0.3)
    workers = [WorkerSnapshot("a", in_flight=3), WorkerSnapshot("b", in_flight=3)]
    ctx = context({"a": 58, "b": 58}, learned({"a": full, "b": CPU}))
    decision = policy.select(request(), workers, ctx)
    assert decision.worker == "b"
    by_worker = {e.worker: e for e in decision.estimates}
    assert by_worker["a"].wait_s == pytest.approx(by_worker["b"].wait_s + 0.9, rel=0.1)


def test_the_decision_explains_itself() -> None:
    """The chosen worker's predicted first-token time, and per candidate its parts, the lowest cost first,
    at most ``MAX_ESTIMATES`` of them."""
    policy = TtftPolicy(TtftSettings())
    workers = [WorkerSnapshot(f"w{i}", in_flight=i % 3, decoding=i % 2) for i in range(MAX_ESTIMATES + 4)]
    ctx = Context(0.0, random.Random(0), {"w5": 58}, fills={}, latency=learned({"w0": CPU}))
    decision = policy.select(request(), workers, ctx)
    estimates = decision.estimates
    assert len(estimates) == MAX_ESTIMATES and estimates[0].worker == decision.worker == "w5"
    assert decision.predicted_ttft_s == estimates[0].ttft_s
    costs = [e.ttft_s + e.added_s + e.cache_s for e in estimates]
    assert costs == sorted(costs)
    for e in estimates:
        assert e.ttft_s == pytest.approx(e.wait_s + e.prefill_s + e.decode_s)
        assert min(e.wait_s, e.prefill_s, e.decode_s, e.added_s, e.cache_s) >= 0.0


snapshot = st.builds(
    WorkerSnapshot,
    name=st.sampled_from([f"w{i}" for i in range(6)]),
    weight=st.sampled_from([0.5, 1.0, 2.0]),
    in_flight=st.integers(0, 30),
    decoding=st.integers(0, 30),
    prefill_backlog=st.floats(0, 1e6),
)


@settings(max_examples=200, deadline=None)
@given(
    workers=st.lists(snapshot, min_size=1, max_size=6, unique_by=lambda w: w.name),
    matched=st.dictionaries(st.sampled_from([f"w{i}" for i in range(6)]), st.integers(0, 60)),
    fills=st.dictionaries(st.sampled_from([f"w{i}" for i in range(6)]), st.floats(0, 1)),
    seed=st.integers(0, 2**16),
)
def test_the_choice_is_a_candidate_under_the_cap(
    workers: list[WorkerSnapshot], matched: dict[str, int], fills: dict[str, float], seed: int
) -> None:
    knobs = TtftSettings()
    model = learned({"w0": CPU, "w1": (0.0, 1e-4, 1e-4, 0.0)})
    ctx = Context(0.0, random.Random(seed), matched, fills=fills, latency=model)
    decision = TtftPolicy(knobs).select(request(), workers, ctx)
    chosen = next(w for w in workers if w.name == decision.worker)
    cap = load_cap(workers, knobs.load_factor, knobs.load_slack)
    assert under_cap(chosen, cap) or not any(under_cap(w, cap) for w in workers)


class Untrusted:
    """A latency view whose rates are ``rates`` and whose recent median error is ``error``."""

    def __init__(self, rates: tuple[float, float, float, float], error: float) -> None:
        self._rates, self._error = rates, error

    def rates(
        self, worker: str, prior: tuple[float, float, float, float]
    ) -> tuple[float, float, float, float]:
        return self._rates

    def uncertainty(self) -> float:
        return self._error


def test_a_move_needs_a_gain_beyond_the_model_s_own_error() -> None:
    """The holder's predicted queue makes the other worker look cheaper by about a third: taken when the
    model's predictions are right to within 10 %, not when they are off by half (the copy and eviction a
    move costs are known; the queue it avoids is a prediction)."""
    policy = TtftPolicy(TtftSettings())
    workers = [WorkerSnapshot("a", in_flight=3, prefill_backlog=1500.0), WorkerSnapshot("b")]
    cost = {}
    for error in (0.1, 0.5):
        ctx = Context(0.0, random.Random(0), {"a": 58}, latency=Untrusted(CPU, error))
        decision = policy.select(request(), workers, ctx)
        cost[error] = decision.worker
        by_worker = {e.worker: e for e in decision.estimates}
        moved = by_worker["b"].ttft_s + by_worker["b"].cache_s + by_worker["b"].added_s
        stayed = by_worker["a"].ttft_s + by_worker["a"].cache_s + by_worker["a"].added_s
        assert 0.5 * stayed < moved < 0.8 * stayed
    assert cost == {0.1: "b", 0.5: "a"}


def new_prefixes(policy: TtftPolicy, workers: list[WorkerSnapshot], error: float, n: int) -> list[str]:
    """Where ``n`` prompts that nobody holds go, one after the other, with the model off by ``error``."""
    placed = []
    for i in range(n):
        req = RouteRequest(f"r{i}", tuple(range(1000 * i, 1000 * i + 60)), 16, 960, 1)
        ctx = Context(0.0, random.Random(0), {}, latency=Untrusted(CPU, error))
        decision = policy.select(req, workers, ctx)
        assert decision.branch == Branch.LOAD_BALANCE
        placed.append(decision.worker)
    return placed


def test_new_prefixes_the_model_cannot_tell_apart_are_spread_over_the_workers() -> None:
    """``a`` always looks a little sooner (a tenth of a request less queued), within the model's error:
    each new prefix becomes the home of the requests that share it, so the tenants are spread evenly
    rather than all homed on ``a`` on the strength of a queue that drains in a second."""
    workers = [WorkerSnapshot("a", in_flight=1, prefill_backlog=900.0), WorkerSnapshot("b", in_flight=1,
               prefill_backlog=1000.0)]  # fmt: skip
    assert new_prefixes(TtftPolicy(TtftSettings()), workers, 0.2, 8).count("a") == 4


def test_a_new_prefix_goes_where_it_comes_soonest_beyond_the_model_s_error() -> None:
    """``b``'s queue makes it costlier by more than the model's error: every new prefix goes to ``a``,
    however many went there before; with the model off by as much as that difference, they are spread."""
    workers = [WorkerSnapshot("a"), WorkerSnapshot("b", in_flight=1, prefill_backlog=300.0)]  # 1.8x a's
    assert new_prefixes(TtftPolicy(TtftSettings()), workers, 0.2, 6) == ["a"] * 6
    assert new_prefixes(TtftPolicy(TtftSettings()), workers, 1.0, 6).count("a") == 3


def test_a_new_prefix_still_goes_where_it_evicts_least() -> None:
    """``a``'s cache is full, ``b``'s empty but queued: their costs are within the model's error, but a copy
    on ``a`` evicts a whole prefix (known, not predicted), so the prefix goes to ``b`` although ``b`` took
    three new prefixes lately and ``a`` none."""
    caches = Caches()
    caches.fills = {"a": 1.0, "b": 0.0}
    workers = [WorkerSnapshot("a"), WorkerSnapshot("b", in_flight=1, prefill_backlog=700.0)]
    ctx = Context(0.0, random.Random(0), {}, caches, fills=caches.fills, latency=Untrusted(CPU, 0.3))
    policy = TtftPolicy(TtftSettings())
    policy.homes.update(b=3.0)
    decision = policy.select(request(), workers, ctx)
    by_worker = {e.worker: e for e in decision.estimates}
    a, b = (by_worker[w].ttft_s + by_worker[w].added_s + by_worker[w].cache_s for w in "ab")
    assert b < a < 1.3 * b and by_worker["a"].cache_s > 1.3 * by_worker["b"].cache_s
    assert decision.worker == "b"


def test_new_homes_are_remembered_for_the_workers_in_the_pool_only() -> None:
    policy = TtftPolicy(TtftSettings())
    workers = [WorkerSnapshot(name) for name in "abc"]
    new_prefixes(policy, workers, 0.0, 40)
    assert set(policy.homes) == {"a", "b", "c"}
    assert sum(policy.homes.values()) <= HOMES_MEMORY  # each new one decays those before it
    policy.on_worker_removed("b")
    assert set(policy.homes) == {"a", "c"}


def chain_of(workers: list[WorkerSnapshot], fills: dict[str, float]) -> float:
    ctx = Context(0.0, random.Random(0), {}, fills=fills)
    return eviction_chain([occupancy(w.name, ctx, w.kv_usage) for w in workers])


def test_an_eviction_in_a_fleet_of_full_caches_sets_off_a_chain_of_recomputes() -> None:
    workers = [WorkerSnapshot("a"), WorkerSnapshot("b"), WorkerSnapshot("c")]
    fills = {"a": 0.2, "b": 1.0, "c": 1.0}
    assert chain_of(workers, fills) == pytest.approx(1.25)
    full = {"a": 1.0, "b": 1.0, "c": 1.0}
    assert chain_of(workers, full) == 3.0  # one per worker
    assert chain_of(workers, {}) == 1.0  # room everywhere
    busy = [WorkerSnapshot("a", kv_usage=0.9), workers[1], workers[2]]  # the engine says a's is full
    assert chain_of(busy, fills) == 3.0


def test_a_queue_worth_a_move_in_a_roomy_fleet_is_not_in_a_full_one() -> None:
    """A copy on the full ``b`` evicts a prefix. While the holder's cache has room, that prefix is
    recomputed there once, and the holder's queue is worth the move; when the holder's cache is full too,
    the recompute evicts in turn (a chain of 2 in a fleet of 2), and the request stays."""
    policy = TtftPolicy(TtftSettings())
    workers = [WorkerSnapshot("a", in_flight=3, prefill_backlog=4500.0), WorkerSnapshot("b")]
    chosen = {}
    for holder_fill in (0.0, 1.0):
        caches = Caches()
        caches.fills = {"a": holder_fill, "b": 1.0}
        latency = Untrusted(CPU, 0.0)
        ctx = Context(0.0, random.Random(0), {"a": 58}, caches, fills=caches.fills, latency=latency)
        chosen[holder_fill] = policy.select(request(), workers, ctx).worker
    assert chosen == {0.0: "b", 1.0: "a"}
