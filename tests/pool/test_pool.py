"""WorkerPool: membership mirrored into the Router, candidates, bounds, in-flight counts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefix_router.pool.pool import PoolError, WorkerPool
from prefix_router.pool.settings import WorkerSettings
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Branch, Decision, Outcome, RouteRequest


def test_membership_is_mirrored_into_the_router(pool: WorkerPool, router: Router) -> None:
    assert sorted(router.workers()) == ["w1", "w2"]
    pool.add(WorkerSettings(url="http://w3:1", name="w3"))
    pool.remove("w1")
    assert sorted(router.workers()) == ["w2", "w3"]
    assert [w.name for w in pool] == ["w2", "w3"]


def test_duplicates_unknowns_and_the_size_bound(router: Router) -> None:
    pool = WorkerPool(router, max_workers=2)
    pool.add(WorkerSettings(url="http://a:1"))
    with pytest.raises(PoolError, match="already"):
        pool.add(WorkerSettings(url="http://a:1"))
    pool.add(WorkerSettings(url="http://b:1"))
    with pytest.raises(PoolError, match="full"):
        pool.add(WorkerSettings(url="http://c:1"))
    assert len(pool) == 2
    with pytest.raises(PoolError, match="unknown"):
        pool.remove("nope")


def test_candidates_follow_models_health_drain_and_caps(pool: WorkerPool, router: Router) -> None:
    w1, w2 = pool.require("w1"), pool.require("w2")
    assert pool.candidates("any", 10) == ["w1", "w2"]  # unknown model lists accept anything
    w1.listed_models = {"m1": {"id": "m1"}}
    assert pool.candidates("m1", 10) == ["w1", "w2"] and pool.candidates("m2", 10) == ["w2"]
    w2.listed_models = {}
    assert not pool.knows_model("m2") and pool.knows_model("m1")
    pool.drain("w1")
    assert pool.candidates("m1", 10) == [] and pool.any_available() is True
    pool.drain("w1", False)
    req = RouteRequest("r1", (), 16, 0, hash_key=0)
    router.dispatched(req, Decision("w1", Branch.LEAST_LOAD), 0.0)  # the routing core's count is the pool's
    assert pool.candidates("m1", 1) == [] and pool.candidates("m1", 2) == ["w1"]
    router.finished(req, "w1", Outcome(), 0.0)
    router.finished(req, "w1", Outcome(), 0.0)  # never below zero
    assert pool.in_flight("w1") == 0 and pool.total_in_flight() == 0


def test_configured_models_win_over_listed(router: Router) -> None:
    pool = WorkerPool(router, max_workers=4)
    worker = pool.add(WorkerSettings(url="http://a:1", models=["x"]))
    worker.listed_models = {"y": {"id": "y"}}
    assert worker.serves("x") and not worker.serves("y")
    assert [m["id"] for m in pool.models()] == ["x"]


def test_ejection_after_failures_and_readmission_after_successes(pool: WorkerPool, router: Router) -> None:
    events: list[tuple[str, bool]] = []
    pool.on_health_change(lambda w, healthy: events.append((w.name, healthy)))
    w1 = pool.require("w1")
    for _ in range(2):
        assert not pool.report(w1, False, "boom")
    pool.report(w1, True)  # a success resets the failure run
    for _ in range(2):
        pool.report(w1, False, "boom")
    assert w1.health.healthy
    assert pool.report(w1, False, "boom") and not w1.health.healthy
    assert pool.candidates(None, 10) == ["w2"]
    assert not pool.report(w1, True)
    assert pool.report(w1, True) and w1.health.healthy
    assert events == [("w1", False), ("w1", True)]


def test_ejection_purges_the_workers_index(pool: WorkerPool, router: Router) -> None:
    from prefix_router.routing.types import Decision, RouteRequest

    req = RouteRequest("r1", blocks=(1, 2, 3), block_tokens=16, key_tokens=48, hash_key=1)
    router.dispatched(req, Decision("w1", Branch.LEAST_LOAD), now=0.0)
    assert router.index.match(req.blocks).get("w1") == 3
    for _ in range(3):
        pool.report(pool.require("w1"), False, "down")
    assert router.index.match(req.blocks).get("w1", 0) == 0
    assert "w1" in router.workers()  # still registered, with an empty index


def test_ejection_keeps_the_in_flight_count_and_the_cap(pool: WorkerPool, router: Router) -> None:
    reqs = [RouteRequest(f"r{i}", blocks=(i,), block_tokens=16, key_tokens=16, hash_key=i) for i in range(2)]
    for req in reqs:
        router.dispatched(req, Decision("w1", Branch.LEAST_LOAD), now=0.0)
    for _ in range(3):
        pool.report(pool.require("w1"), False, "down")
    assert router.index.blocks_of("w1") == 0  # the cache is forgotten, the running requests are not
    assert pool.in_flight("w1") == 2 and pool.total_in_flight() == 2
    for _ in range(2):
        pool.report(pool.require("w1"), True)
    assert pool.candidates(None, 2) == ["w2"] and pool.candidates(None, 3) == ["w1", "w2"]
    for req in reqs:
        router.finished(req, "w1", Outcome(), now=1.0)
    assert pool.in_flight("w1") == 0 and pool.total_in_flight() == 0


worker_states = st.lists(
    st.tuples(
        st.booleans(),  # healthy
        st.booleans(),  # draining
        st.integers(0, 3),  # in flight
        st.sets(st.sampled_from("xy"), max_size=2),  # configured models
        st.one_of(st.none(), st.sets(st.sampled_from("xyz"), max_size=3)),  # listed models
    ),
    min_size=1,
    max_size=6,
)


@given(worker_states, st.one_of(st.none(), st.sampled_from("xyz")), st.integers(0, 4))
def test_candidates_are_the_available_serving_workers_below_the_cap(
    states: list[tuple[bool, bool, int, set[str], set[str] | None]], model: str | None, cap: int
) -> None:
    """``candidates`` inlines ``Worker.available`` and ``Worker.serves`` (per request and worker): it must
    keep saying exactly what they say."""
    router = Router(RoutingSettings())
    pool = WorkerPool(router, max_workers=8)
    for i, (healthy, draining, in_flight, configured, listed) in enumerate(states):
        worker = pool.add(WorkerSettings(url=f"http://w{i}:8000", name=f"w{i}", models=sorted(configured)))
        worker.health.healthy, worker.draining = healthy, draining
        worker.listed_models = None if listed is None else {m: {"id": m} for m in listed}
        for j in range(in_flight):
            req = RouteRequest(f"r{i}-{j}", (), 16, 0, hash_key=0)
            router.dispatched(req, Decision(worker.name, Branch.LEAST_LOAD), 0.0)
    expected = [
        w.name
        for w in pool
        if w.available and pool.in_flight(w.name) < cap and (model is None or w.serves(model))
    ]
    assert pool.candidates(model, cap) == expected
