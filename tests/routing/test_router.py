from __future__ import annotations

import random

import pytest

from prefix_router.routing.router import IndexChange, Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Outcome, RouteRequest


def make_router(**kw: object) -> Router:
    cfg = RoutingSettings.model_validate(
        {"keys": {"block_tokens": 16}, "index": {"worker_capacity_tokens": 16 * 100}, **kw}
    )
    router = Router(cfg, random.Random(0))
    for name in ("a", "b", "c"):
        router.add_worker(name)
    return router


def rr(rid: str, blocks: tuple[int, ...], session: str | None = None) -> RouteRequest:
    return RouteRequest(
        rid, blocks, 16, 16 * len(blocks) + 5, hash_key=blocks[0] if blocks else 0, session=session
    )


def run(router: Router, req: RouteRequest, now: float, **outcome: object) -> str:
    d = router.route(req, ["a", "b", "c"], now)
    router.dispatched(req, d, now)
    router.first_token(req.request_id)
    router.finished(req, d.worker, Outcome(**outcome), now)  # type: ignore[arg-type]
    return d.worker


def test_repeated_prefix_goes_to_the_same_worker_with_a_prediction() -> None:
    router = make_router()
    w = run(router, rr("1", (1, 2, 3)), 0)
    d = router.route(rr("2", (1, 2, 3, 4)), ["a", "b", "c"], 1)
    assert d.worker == w and d.matched_blocks == 3 and d.predicted_tokens == 48 and d.branch == "prefix_hit"


def test_prediction_is_reported_for_every_policy() -> None:
    router = make_router()
    w = run(router, rr("1", (1, 2)), 0)
    d = router.route(rr("2", (1, 2)), [w], 1, policy="random")
    assert d.predicted_tokens == 32
    with pytest.raises(KeyError):
        router.route(rr("3", (1,)), ["a"], 1, policy="nope")


def test_in_flight_is_released_and_bounded() -> None:
    router = make_router(trackers={"max_tracked_requests": 5})
    for i in range(20):
        req = rr(str(i), (i,))
        router.dispatched(req, router.route(req, ["a", "b", "c"], 0), 0)
    assert router.load.tracked() == 5
    assert sum(router.load.in_flight(w) for w in "abc") == 5


def test_failed_request_forgets_unconfirmed_blocks() -> None:
    router = make_router()
    w = run(router, rr("1", (1, 2, 3)), 0, ok=False)
    assert router.index.match((1, 2, 3)) == {}
    assert router.load.in_flight(w) == 0


def test_extension_blocks_are_indexed_for_the_next_turn() -> None:
    router = make_router()
    w = run(router, rr("1", (1, 2)), 0, extension_blocks=(1, 2, 3, 4))
    assert router.index.match((1, 2, 3, 4, 5)) == {w: 4}


def test_engine_feedback_forgets_what_the_engine_evicted() -> None:
    router = make_router()
    w = run(router, rr("1", (1, 2, 3)), 0)
    old = rr("0", (50, 51))
    router.dispatched(old, router.route(old, [w], 0), -5)  # older entry on the same worker
    router.finished(old, w, Outcome(), -5)
    req = rr("2", (1, 2, 3))
    d = router.route(req, [w], 10)
    router.dispatched(req, d, 10)
    router.finished(req, w, Outcome(cached_tokens=0), 11)
    assert router.index.match((50, 51)) == {}  # older than the missed blocks: gone in an LRU engine
    assert router.index.match((1, 2, 3)) == {w: 3}  # recomputed by this very request
    assert router.feedback[w].mismatches == 1


def test_session_affinity_is_sticky_under_the_cap() -> None:
    router = make_router()
    first = run(router, rr("1", (9,), session="s"), 0)
    assert all(
        router.route(rr(str(i), (i + 100,), session="s"), ["a", "b", "c"], 1).worker == first
        for i in range(5)
    )


def test_remove_worker_purges_index_and_sessions() -> None:
    router = make_router()
    w = run(router, rr("1", (1, 2), session="s"), 0)
    router.remove_worker(w)
    assert router.index.match((1, 2)) == {}
    assert w not in router.workers()
    assert router.route(rr("2", (1,), session="s"), [x for x in "abc" if x != w], 1).branch != "session"


def test_changes_are_emitted_and_apply_to_another_router() -> None:
    a, b = make_router(), make_router()
    changes: list[IndexChange] = []
    a.on_change = changes.append
    run(a, rr("1", (1, 2)), 0, extension_blocks=(1, 2, 3))
    for change in changes:
        b.apply(change)
    assert b.index.match((1, 2, 3)) == a.index.match((1, 2, 3))


def test_summary_is_json_like() -> None:
    router = make_router()
    run(router, rr("1", (1,)), 0, cached_tokens=0)
    summary = router.summary()
    assert summary["index"]["entries"] == 1  # type: ignore[index]
    assert set(summary["workers"]) == {"a", "b", "c"}  # type: ignore[arg-type]


def test_baselines_ignore_session_affinity() -> None:
    router = make_router()
    req = rr("1", (9,), session="s")
    d = router.route(req, ["a", "b", "c"], 0)
    router.dispatched(req, d, 0)
    picks = {
        router.route(rr(str(i), (i + 100,), session="s"), ["a", "b", "c"], 1, policy="random").worker
        for i in range(30)
    }
    assert len(picks) > 1
