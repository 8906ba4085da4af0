"""Engine feedback corrects without destroying: a short report never forgets a prefix, gaps of a page or
two and requests that raced their prefix's first prefill are ignored, reports are clamped to the prompt,
and the worker's learned capacity moves one bounded step per report."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefix_router.routing.feedback import FeedbackTuning
from prefix_router.routing.router import ChangeKind, IndexChange, Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Branch, Decision, Outcome, RouteRequest
from support.routing import new_router, prefix
from support.routing import route_request as req

CAPACITY = 16 * 1000  # tokens, 1000 blocks of 16


def make_router(**feedback: object) -> Router:
    tuning = FeedbackTuning(**{"min_capacity_tokens": 16 * 100, **feedback})  # type: ignore[arg-type]
    settings = {"keys": {"block_tokens": 16}, "index": {"worker_capacity_tokens": CAPACITY}}
    return new_router(settings, feedback=tuning)


def serve(router: Router, request: RouteRequest, now: float, first: bool = True, **outcome: object) -> int:
    """Route (to "a"), dispatch, optionally first token, finish; returns the predicted tokens."""
    decision = router.route(request, ["a"], now)
    router.dispatched(request, decision, now)
    if first:
        router.first_token(request.route_id, now)
    router.finished(request, "a", Outcome(**outcome), now)  # type: ignore[arg-type]
    return decision.predicted_tokens


def held(router: Router, *tags: int) -> list[int]:
    return [router.index.match(prefix(tag)).get("a", 0) for tag in tags]


def test_a_short_report_forgets_no_other_prefix_and_not_its_own_chain() -> None:
    router = make_router()
    for tag in range(1, 6):
        serve(router, req(f"p{tag}", prefix(tag)), float(tag))
    again = req("again", prefix(3, 8))  # shares prefix 3, e.g. the next turn of a reasoning conversation
    assert serve(router, again, 10.0, cached_tokens=0) == 64
    assert held(router, 1, 2, 3, 4, 5) == [4, 4, 4, 4, 4]  # every other prefix is still there
    assert router.index.match(prefix(3, 8)) == {"a": 8}  # the engine has just computed it again
    stats = router.feedback["a"]
    assert (stats.reports, stats.miss, stats.predicted_tokens, stats.reported_tokens) == (1, 1, 64, 0)


def test_a_shortfall_of_a_page_or_two_is_agreement() -> None:
    router = make_router()
    serve(router, req("p0", prefix(0)), 0.5)
    serve(router, req("p1", prefix(1, 1)), 1.0)
    serve(router, req("p2", prefix(2)), 2.0)
    # a one-page prediction comes back as 0 (the engine recomputes the last prompt page) ...
    assert serve(router, req("one", prefix(1, 2)), 3.0, cached_tokens=0) == 16
    # ... and a 4-page prediction as 2 pages: both within slack_pages (2) of 16 tokens
    assert serve(router, req("four", prefix(2, 6)), 4.0, cached_tokens=32) == 64
    assert held(router, 0, 1, 2) == [4, 2, 4]
    assert router.index.capacity_tokens("a") == CAPACITY
    assert router.feedback["a"].agree == 2 and router.feedback["a"].miss == 0


def test_a_request_that_raced_its_prefixs_first_prefill_is_ignored() -> None:
    router = make_router()
    serve(router, req("older", prefix(6)), 0.5)
    first = req("first", prefix(7))
    router.dispatched(first, router.route(first, ["a"], 1.0), 1.0)  # still prefilling
    # dispatched meanwhile on the same prefix: the engine cannot serve blocks it is still computing
    assert serve(router, req("racer", prefix(7)), 1.1, cached_tokens=0) == 64
    assert router.index.capacity_tokens("a") == CAPACITY and held(router, 6, 7) == [4, 4]
    assert router.feedback["a"].raced == 1
    router.first_token("first", 1.5)
    router.finished(first, "a", Outcome(cached_tokens=0), 2.0)
    # after the first prefill, the same report is a real miss (one capacity step, nothing forgotten)
    assert serve(router, req("later", prefix(7)), 3.0, cached_tokens=0) == 64
    assert router.feedback["a"].miss == 1 and router.index.capacity_tokens("a") == CAPACITY * 9 // 10
    assert held(router, 6, 7) == [4, 4]


@pytest.mark.parametrize(
    ("cached", "engine_prompt", "reported", "clamped"),
    [
        (10**308, None, 69, 1),  # above the router's estimate of the prompt (4 blocks + 5 tokens)
        (10**308, 80, 80, 1),  # the engine's own prompt length is the bound when it gives one
        (10**308, 10**308, 69, 1),  # an absurd prompt length is no bound
        (-5, None, 0, 1),
        (40, 80, 40, 0),
    ],
)
def test_reports_are_clamped_to_the_prompt(
    cached: int, engine_prompt: int | None, reported: int, clamped: int
) -> None:
    router = make_router()
    serve(router, req("p", prefix(1)), 1.0)
    serve(router, req("q", prefix(1)), 2.0, cached_tokens=cached, reported_prompt_tokens=engine_prompt)
    stats = router.feedback["a"]
    assert (stats.reports, stats.reported_tokens, stats.clamped) == (1, reported, clamped)
    assert router.summary()["workers"]["a"]["feedback"]["reported_tokens"] == reported  # type: ignore[index]


def test_unreported_responses_are_counted_apart_from_the_sums() -> None:
    router = make_router()
    serve(router, req("p", prefix(1)), 1.0)
    serve(router, req("q", prefix(1)), 2.0)  # no cached_tokens in the responses
    stats = router.feedback["a"]
    assert (stats.unreported, stats.reports, stats.predicted_tokens) == (2, 0, 0)


def test_the_capacity_moves_one_step_per_report_between_the_floor_and_the_known_size() -> None:
    router = make_router()
    changes: list[IndexChange] = []
    router.on_change = changes.append
    serve(router, req("p", prefix(1)), 0.0)
    caps = []
    for i in range(40):
        serve(router, req(f"m{i}", prefix(1)), 1.0 + i, cached_tokens=0)
        caps.append(router.index.capacity_tokens("a"))
    assert caps[0] == CAPACITY * 9 // 10 and all(b >= a * 0.89 for a, b in itertools.pairwise(caps))
    assert caps[-1] == 16 * 100  # min_capacity_tokens
    assert [c.keep for c in changes if c.kind == ChangeKind.CAPACITY][:2] == [900, 810]  # for replicas
    assert held(router, 1) == [4]
    # over-reports grow it back, while the index is full only, and never beyond the known size
    grown = [router.index.capacity_tokens("a")]
    for i in range(100):  # new 40-block prompts the engine already held: predicted 0, cached 640
        serve(router, req(f"o{i}", prefix(200 + i, 40)), 200.0 + i, cached_tokens=640)
        grown.append(router.index.capacity_tokens("a"))
    assert all(a <= b <= a * 1.1 + 16 for a, b in itertools.pairwise(grown))
    assert grown[-1] == CAPACITY  # back to the known size, and no further
    router.set_capacity("a", 16 * 500)  # the engine's real size was scraped: the new ceiling
    assert router.index.capacity_tokens("a") == router.index.ceiling_tokens("a") == 16 * 500


def test_over_reports_do_not_grow_an_index_that_is_not_full() -> None:
    router = make_router()
    for i in range(5):
        serve(router, req(f"m{i}", prefix(1)), float(i), cached_tokens=0)
    shrunk = router.index.capacity_tokens("a")
    serve(router, req("o", prefix(9)), 10.0, cached_tokens=64)
    assert router.feedback["a"].over == 1 and router.index.capacity_tokens("a") == shrunk


def test_capacity_step_zero_learns_nothing() -> None:
    router = make_router(capacity_step=0.0)
    serve(router, req("p", prefix(1)), 0.0)
    serve(router, req("m", prefix(1)), 1.0, cached_tokens=0)
    assert router.feedback["a"].miss == 1 and router.index.capacity_tokens("a") == CAPACITY


def test_no_state_is_re_created_for_a_removed_worker() -> None:
    router = make_router()
    router.add_worker("b")
    running = req("r", prefix(1))
    router.dispatched(running, router.route(running, ["b"], 0.0), 0.0)
    router.remove_worker("b")
    router.set_engine_load("b", 9, 0.9, 1.0)  # a scrape that was in flight
    router.set_capacity("b", 1600)
    late = req("late", prefix(2))
    router.dispatched(late, Decision("b", Branch.LEAST_LOAD), 1.0)  # dispatched to it after its removal
    router.finished(running, "b", Outcome(cached_tokens=0, extension_blocks=prefix(1, 6)), 2.0)
    router.finished(late, "b", Outcome(ok=False), 2.0)
    assert "b" not in router.workers() and "b" not in router.feedback and router.load.tracked() == 0
    router.add_worker("b")  # a worker of the same name starts clean
    snap = router.load.snapshot("b", 2.0)
    assert (snap.in_flight, snap.queue_depth, snap.kv_usage) == (0, 0, None)
    assert router.index.capacity_tokens("b") == CAPACITY and router.index.blocks_of("b") == 0


def test_the_prefill_tracker_is_bounded_and_incarnations_do_not_mix() -> None:
    from prefix_router.routing.feedback import PrefillTracker

    tracker = PrefillTracker(capacity=3)
    for i in range(10):
        tracker.started(f"r{i}", "a", prefix(i)[0])
    assert len(tracker) == 3 and tracker.pending_prefixes() == 3
    assert tracker.racing("a", prefix(9, 2)) and not tracker.racing("a", prefix(1))
    tracker.forget_worker("a")  # removed; then added again, and a new request starts its prefill
    tracker.started("new", "a", prefix(8)[0])
    tracker.done("r8")  # a late end of the old incarnation's request on the same blocks
    assert tracker.racing("a", prefix(8))
    tracker.done("new")
    assert not tracker.racing("a", prefix(8)) and tracker.pending_prefixes() == 0


def test_a_request_matching_a_prefix_that_is_still_prefilling_deeper_is_not_a_racer() -> None:
    router = make_router()
    serve(router, req("base", prefix(3, 4)), 1.0)  # prefix 3's first 4 blocks, done
    longer = req("longer", prefix(3, 8))
    router.dispatched(longer, router.route(longer, ["a"], 2.0), 2.0)  # blocks 4-7 in their first prefill
    assert serve(router, req("short", prefix(3, 4)), 2.1, cached_tokens=0) == 64  # blocks 0-3 were ready
    assert router.feedback["a"].miss == 1 and router.feedback["a"].raced == 0
    assert serve(router, req("deep", prefix(3, 8)), 2.2, cached_tokens=0) == 128  # blocks 4-7 were not
    assert router.feedback["a"].raced == 1


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["start", "first", "finish"]), st.integers(0, 12), st.integers(0, 3)),
        max_size=60,
    )
)
def test_pending_prefills_never_outlive_their_requests(ops: list[tuple[str, int, int]]) -> None:
    router = make_router()
    live: set[str] = set()
    for op, n, tag in ops:
        rid = f"r{n}"
        if op == "start" and rid not in live:
            request = req(rid, prefix(tag))
            router.dispatched(request, router.route(request, ["a"], 0.0), 0.0)
            live.add(rid)
        elif op == "first":
            router.first_token(rid, 0.0)
        elif op == "finish" and rid in live:
            router.finished(req(rid, prefix(tag)), "a", Outcome(ok=False), 0.0)
            live.discard(rid)
    for rid in list(live):
        router.finished(req(rid, ()), "a", Outcome(ok=False), 0.0)
    assert router.summary()["prefilling_requests"] == 0


def small_router(**feedback: object) -> Router:
    """One worker whose index holds 12 blocks (three 4-block prefixes): full, it evicts."""
    cfg = RoutingSettings.model_validate(
        {
            "keys": {"block_tokens": 16},
            "index": {"worker_capacity_tokens": 16 * 12},
        }
    )
    tuning = FeedbackTuning(**{"min_capacity_tokens": 16, **feedback})  # type: ignore[arg-type]
    router = Router(cfg, random.Random(0), feedback=tuning)
    router.add_worker("a")
    for tag, at in ((1, 0.0), (2, 50.0), (3, 90.0)):
        serve(router, req(f"p{tag}", prefix(tag)), at)
    return router


def short_report_after(router: Router, first_token_at: float, traffic: bool) -> None:
    """Prefix 2 (last touched at 50 s) is requested at 91 s; while the request waits, other prefixes may
    arrive (and evict older ones); at ``first_token_at`` it starts, and its engine reports 0 cached."""
    waiting = req("q", prefix(2))
    router.dispatched(waiting, router.route(waiting, ["a"], 91.0), 91.0)
    if traffic:
        for tag, at in ((4, 100.0), (5, 110.0)):
            serve(router, req(f"p{tag}", prefix(tag)), at)
    router.first_token("q", first_token_at)
    router.finished(waiting, "a", Outcome(cached_tokens=0), first_token_at)


def test_the_index_turnover_is_the_age_of_its_oldest_entry_once_full() -> None:
    router = make_router()
    serve(router, req("p1", prefix(1)), 0.0)
    assert router.index.turnover("a", 5.0) is None  # 4 of 1000 blocks: nothing was evicted for room
    full = small_router()
    assert full.index.turnover("a", 100.0) == 100.0  # prefix 1, touched at 0 s, goes next


def test_a_short_report_of_a_request_that_started_promptly_is_a_miss() -> None:
    router = small_router()
    short_report_after(router, first_token_at=92.0, traffic=False)
    stats = router.feedback["a"]
    assert (stats.miss, stats.queued) == (1, 0)
    assert router.index.capacity_tokens("a") < 16 * 12  # one capacity step


def test_a_short_report_explained_by_a_long_queue_changes_nothing() -> None:
    # the prefix was 100 s old when the engine started the request; the index's oldest entry is 59 s
    # old: the index's own LRU would have evicted it too, had it touched it when the engine did
    router = small_router()
    short_report_after(router, first_token_at=150.0, traffic=True)
    stats = router.feedback["a"]
    assert (stats.miss, stats.queued, stats.reports) == (0, 1, 1)
    assert router.index.capacity_tokens("a") == 16 * 12
    never = small_router(queued_turnover=None)  # the knob off: the same report is a miss
    short_report_after(never, first_token_at=150.0, traffic=True)
    assert (never.feedback["a"].miss, never.feedback["a"].queued) == (1, 0)
    assert never.index.capacity_tokens("a") < 16 * 12
