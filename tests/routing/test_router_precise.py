"""The router on event-fed views: a hybrid fleet, predictions from confirmed blocks, a burst steered by
speculative entries, the approximate view while a worker's events are stale, no request routed on an old
view after a restart's first message, and the agreement counted against the engines' reports."""

from __future__ import annotations

from prefix_router.events import AllBlocksCleared, BlockRemoved, BlockStored
from prefix_router.routing.precise import PreciseTuning, precise_chain, precise_seed
from prefix_router.routing.router import Router
from prefix_router.routing.types import Branch, Outcome, RouteRequest
from support.routing import new_router

BS = 8  # the engines' block size; the index's is 4 (keys.block_tokens)
WORKERS = ["a", "b", "c"]


def make_router() -> Router:
    settings = {"keys": {"block_tokens": 4, "mode": "events"}, "events": {"block_tokens": BS}}
    tuning = PreciseTuning(silence_s=5, speculative_ttl_s=2)
    router = new_router(settings, WORKERS, seed=3, precise=tuning)
    router.add_event_worker("a", "m")
    router.add_event_worker("b", "m")  # "c" publishes nothing: the approximate view (hybrid)
    return router


def request(rid: str, tokens: list[int]) -> RouteRequest:
    approx = tuple(hash(("approx", tuple(tokens[: (i + 1) * 4]))) for i in range(len(tokens) // 4))
    precise = precise_chain(tokens, BS, precise_seed("m", None, None))
    return RouteRequest(
        route_id=rid,
        blocks=approx,
        block_tokens=4,
        key_tokens=len(tokens),
        hash_key=approx[0],
        exact=True,
        precise_blocks=precise,
        precise_tokens=len(tokens),
    )


def stored(tokens: list[int], base: int) -> BlockStored:
    full = len(tokens) - len(tokens) % BS
    return BlockStored(tuple(base + i for i in range(full // BS)), None, tuple(tokens[:full]), BS)


PROMPT = list(range(1, 43))  # 5 engine blocks and 2 tokens


def test_routes_to_the_worker_whose_events_hold_the_prefix_and_predicts_its_blocks() -> None:
    router = make_router()
    router.precise.apply("b", [stored(PROMPT[:24], 10)], 0.0)  # b holds 3 of the 5 blocks
    decision = router.route(request("r", PROMPT), WORKERS, 1.0)
    assert decision.worker == "b"
    assert decision.predicted_tokens == 24 and decision.matched_blocks == 6  # 24 tokens of index blocks


def test_a_burst_of_one_new_prefix_stays_on_one_worker_before_the_first_event() -> None:
    router = make_router()
    chosen = set()
    long = list(range(1, 4003))  # worth more than the policy's in-flight penalty
    for i in range(6):
        req = request(f"r{i}", long)
        decision = router.route(req, ["a", "b"], 1.0 + i * 0.01)
        router.dispatched(req, decision, 1.0 + i * 0.01)
        chosen.add(decision.worker)
        assert decision.predicted_tokens == 0  # speculative entries steer, never predict
    assert len(chosen) == 1


def test_speculative_entries_expire_without_an_event() -> None:
    router = make_router()
    req = request("r", PROMPT)
    decision = router.route(req, ["a", "b"], 1.0)
    router.dispatched(req, decision, 1.0)
    assert router.precise.speculative_blocks(decision.worker) == 5
    router.route(request("r2", [99, *PROMPT]), ["a", "b"], 3.5)  # any later decision expires them
    assert router.precise.speculative_blocks(decision.worker) == 0


def test_a_silent_worker_is_routed_on_the_approximate_view_visibly() -> None:
    router = make_router()
    req = request("r", PROMPT)
    router.dispatched(req, router.route(req, ["a"], 1.0), 1.0)  # a is expected to store 5 blocks
    router.finished(req, "a", Outcome(cached_tokens=0, reported_prompt_tokens=42), 2.0)
    assert router.precise.fresh("a", 5.0) and not router.precise.fresh("a", 7.0)
    decision = router.route(request("r2", PROMPT), ["a", "b"], 7.0)
    assert decision.worker == "a"  # the approximate index holds what was dispatched there
    assert decision.predicted_tokens == 40  # in the index's blocks: 10 of 4 tokens
    assert router.summary(7.0)["workers"]["a"]["precise"]["state"] == "silent"  # type: ignore[index]


def test_no_request_routed_on_the_old_view_after_a_restarts_first_message() -> None:
    router = make_router()
    router.precise.observe_seq("b", 0, 0.0)
    router.precise.apply("b", [stored(PROMPT, 10)], 0.0)
    assert router.route(request("r1", PROMPT), ["a", "b"], 1.0).worker == "b"
    router.precise.observe_seq("b", 0, 2.0)  # the new process's first message
    decision = router.route(request("r2", PROMPT), ["a", "b"], 2.0)
    assert decision.predicted_tokens == 0
    router.precise.apply("a", [stored(PROMPT, 50)], 2.0)
    assert router.route(request("r3", PROMPT), ["a", "b"], 2.0).worker == "a"


def lived_on_a_then_evicted(router: Router, in_flight: int) -> None:
    """PROMPT was served by a and stored there, then a's engine evicted all of it; ``in_flight`` other
    requests are still running on a. The approximate index's fill of a makes the cost model prefer b."""
    req = request("first", PROMPT)
    router.dispatched(req, router.route(req, ["a"], 1.0), 1.0)
    router.finished(req, "a", Outcome(cached_tokens=0, reported_prompt_tokens=42), 1.2)
    router.precise.apply("a", [stored(PROMPT, 10)], 1.2)
    router.precise.apply("a", [BlockRemoved(tuple(range(10, 15)))], 1.3)
    for i in range(in_flight):
        tokens = [1000 * (i + 1) + t for t in range(BS)]
        other = request(f"busy{i}", tokens)
        router.dispatched(other, router.route(other, ["a"], 1.4), 1.4)
        router.precise.apply("a", [stored(tokens, 100 + i)], 1.4)


def test_a_prefix_evicted_everywhere_goes_back_to_its_last_home() -> None:
    """Held nowhere: without the last home the cost model sends it to b (a's cache looks fuller), where
    re-filling it would evict another tenant's prefix; a is under the load cap, so it goes back to a."""
    for in_flight in (0, 5):  # 5 on a, 0 on b: a still under ceil(1.25 x 6 / 2) + 2 = 6
        router = make_router()
        lived_on_a_then_evicted(router, in_flight)
        decision = router.route(request("again", PROMPT), ["a", "b"], 2.0)
        assert (decision.worker, decision.branch) == ("a", Branch.HOME)
        assert decision.predicted_tokens == 0  # the events say nothing is held: nothing predicted


def test_a_last_home_over_the_load_cap_is_passed_over() -> None:
    router = make_router()
    lived_on_a_then_evicted(router, 7)  # a would take 8 in flight, the cap is ceil(1.25 x 8 / 2) + 2 = 7
    decision = router.route(request("again", PROMPT), ["a", "b"], 2.0)
    assert decision.worker == "b" and decision.branch != Branch.HOME


def test_a_home_that_stored_a_cache_worth_since_leaves_the_choice_to_the_policy() -> None:
    """a's working set is larger than its cache: it stored more blocks since the eviction than it holds
    now, so PROMPT goes where the cost model sends it (b, the emptier) and a's tenants spread."""
    router = make_router()
    lived_on_a_then_evicted(router, 2)
    router.precise.apply("a", [BlockRemoved((100,))], 1.5)  # 2 stored since, 1 held
    decision = router.route(request("again", PROMPT), ["a", "b"], 2.0)
    assert decision.worker == "b" and decision.branch != Branch.HOME


def test_a_prefix_held_somewhere_goes_where_it_is_held_not_home() -> None:
    router = make_router()
    lived_on_a_then_evicted(router, 0)
    router.precise.apply("b", [stored(PROMPT[:16], 50)], 1.5)  # b holds the first 2 of its 5 blocks
    decision = router.route(request("again", PROMPT), ["a", "b"], 2.0)
    assert decision.worker == "b" and decision.predicted_tokens == 16


def test_cleared_engine_predicts_nothing() -> None:
    router = make_router()
    router.precise.apply("a", [stored(PROMPT, 10)], 0.0)
    router.precise.apply("a", [AllBlocksCleared()], 0.0)
    assert router.route(request("r", PROMPT), ["a"], 1.0).predicted_tokens == 0


def test_agreement_with_the_engines_reports_is_counted_and_learns_no_capacity() -> None:
    router = make_router()
    router.precise.apply("a", [stored(PROMPT, 10)], 0.0)
    capacity = router.index.capacity_blocks("a")
    for i, reported in enumerate([40, 32, 0]):
        req = request(f"r{i}", PROMPT)
        decision = router.route(req, ["a"], 1.0)
        router.dispatched(req, decision, 1.0)
        router.finished(req, "a", Outcome(cached_tokens=reported, reported_prompt_tokens=42), 1.5)
    stats = router.precise.stats("a")
    assert (stats.reports, stats.within_block, stats.above_report, stats.above_prompt) == (3, 2, 2, 0)
    assert router.index.capacity_blocks("a") == capacity


def test_ejected_worker_forgets_its_event_fed_view() -> None:
    router = make_router()
    router.precise.apply("a", [stored(PROMPT, 10)], 0.0)
    router.forget_cache("a")
    assert router.precise.held_blocks("a") == 0
    router.remove_worker("b")
    assert "b" not in router.precise


def test_an_engine_that_says_its_cache_is_empty_empties_its_approximate_index_too() -> None:
    """A restart or AllBlocksCleared: the worker's index entries go (its fill drives the cost model and
    its view is used whenever the events are not fresh); the other workers' stay."""
    router = make_router()
    for i, worker in enumerate(WORKERS):
        req = request(f"r{i}", [i * 100 + t for t in PROMPT])
        router.dispatched(req, router.route(req, [worker], 1.0), 1.0)
    before = {w: router.index.blocks_of(w) for w in WORKERS}
    assert all(before.values())
    router.precise.observe_seq("a", 0, 2.0)
    router.precise.apply("a", [AllBlocksCleared()], 2.0)
    assert router.index.blocks_of("a") == 0 and router.index.blocks_of("b") == before["b"]
    router.precise.observe_seq("b", 5, 3.0)
    router.precise.observe_seq("b", 0, 3.1)  # backwards: a new engine process
    assert router.index.blocks_of("b") == 0 and router.index.blocks_of("c") == before["c"]


def test_the_reply_blocks_of_a_finished_turn_are_held_speculatively_until_their_events_arrive() -> None:
    router = make_router()
    router.precise.apply("b", [stored(PROMPT[:40], 10)], 0.0)
    first = request("t0", PROMPT)
    decision = router.route(first, ["a", "b"], 1.0)
    router.dispatched(first, decision, 1.0)
    turn = PROMPT + list(range(100, 130))  # the next turn: the prompt and the reply, 9 engine blocks
    extension = precise_chain(turn[:72], BS, precise_seed("m", None, None))
    router.finished(first, "b", Outcome(True, 40, precise_extension_blocks=extension), 2.0)
    assert router.precise.speculative_blocks("b") == 4  # the reply's blocks, not reported yet
    follow = request("t1", turn)
    match = router.precise.match(follow.precise_blocks, 2.001)
    assert match.steered["b"] == 9 and match.confirmed["b"] == 5  # steered by them, never predicted
    decision = router.route(follow, ["a", "b"], 2.001)
    assert decision.worker == "b" and decision.predicted_tokens == 40
    assert decision.expected_cached_tokens == 72  # the load is charged with what the engine will reuse
    router.precise.apply("b", [BlockStored((20, 21, 22, 23), 14, tuple(turn[40:72]), BS)], 2.005)
    assert router.precise.speculative_blocks("b") == 0 and router.precise.held_blocks("b") == 9


def test_a_reply_whose_blocks_were_all_reported_expects_no_more_events() -> None:
    router = make_router()
    turn = PROMPT + list(range(100, 130))
    router.precise.apply("b", [stored(turn[:72], 10)], 0.0)
    first = request("t0", PROMPT)
    decision = router.route(first, ["b"], 1.0)
    router.dispatched(first, decision, 1.0)
    extension = precise_chain(turn[:72], BS, precise_seed("m", None, None))
    router.finished(first, "b", Outcome(True, 40, precise_extension_blocks=extension), 2.0)
    assert router.precise.speculative_blocks("b") == 0
    assert router.precise.fresh("b", 100.0)  # an idle engine that owes nothing is not silent


def test_the_load_is_charged_with_the_blocks_speculated_on_the_chosen_worker() -> None:
    router = make_router()
    long = list(range(1, 4003))
    first = request("r0", long)
    router.dispatched(first, router.route(first, ["a"], 1.0), 1.0)
    second = request("r1", long)
    decision = router.route(second, ["a"], 1.01)  # its prefix is being computed there
    assert decision.predicted_tokens == 0 and decision.expected_cached_tokens == 4000
    before = router.load.snapshot("a", 1.01).prefill_backlog
    router.dispatched(second, decision, 1.01)
    assert router.load.snapshot("a", 1.01).prefill_backlog - before < 100  # 2 uncached tokens, not 4002
