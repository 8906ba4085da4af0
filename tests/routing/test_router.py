from __future__ import annotations

import random

import pytest

from prefix_router.routing.router import IndexChange, Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Branch, Decision, Outcome, RouteRequest
from prefix_router.routing.units import UnitTuning
from support.routing import new_router
from support.routing import route_request as rr


def make_router(**kw: object) -> Router:
    return new_router(
        {"keys": {"block_tokens": 16}, "index": {"worker_capacity_tokens": 16 * 100}, **kw}, ("a", "b", "c")
    )


def run(router: Router, req: RouteRequest, now: float, first: bool = True, **outcome: object) -> str:
    d = router.route(req, ["a", "b", "c"], now)
    router.dispatched(req, d, now)
    if first:
        router.first_token(req.route_id, now)
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


def test_prediction_is_whole_engine_blocks_once_the_block_size_is_known() -> None:
    """An engine caching whole blocks of 128 (vLLM's CPU backend) holds 128 tokens of a 13-block match
    (208 tokens), never 208; and of a prompt matched whole, the whole blocks of all but its last token."""
    router = make_router()
    blocks = tuple(range(1, 17))  # 16 blocks of 16 tokens
    w = run(router, rr("1", blocks), 0)
    assert router.route(rr("2", (*blocks[:13], 99)), [w], 1).predicted_tokens == 208  # not known yet
    router.set_engine_block(w, 128)
    assert router.engine_block_tokens(w) == 128
    assert router.route(rr("3", (*blocks[:13], 99)), [w], 1).predicted_tokens == 128
    exact = RouteRequest("4", blocks, 16, 256, hash_key=1)  # 256 tokens: the engine computes the 256th
    assert router.route(exact, [w], 1).predicted_tokens == 128
    assert router.route(rr("5", blocks), [w], 1).predicted_tokens == 256  # 261 tokens: two whole blocks
    other = next(n for n in "abc" if n != w)
    assert router.engine_block_tokens(other) is None
    router.remove_worker(w)
    assert router.engine_block_tokens(w) is None


def test_in_flight_is_released_and_bounded() -> None:
    router = make_router(trackers={"max_tracked_requests": 5})
    for i in range(20):
        req = rr(str(i), (i,))
        router.dispatched(req, router.route(req, ["a", "b", "c"], 0), 0)
    assert router.load.tracked() == 5
    assert sum(router.load.in_flight(w) for w in "abc") == 5


def test_a_failure_before_the_first_token_forgets_the_unconfirmed_blocks() -> None:
    router = make_router()
    w = run(router, rr("0", (1, 2)), 0)
    assert run(router, rr("1", (1, 2, 3, 4)), 1, first=False, ok=False) == w
    assert router.index.match((1, 2, 3, 4)) == {w: 2}  # what was predicted stays, the rest goes
    assert router.load.in_flight(w) == 0


def test_a_failure_after_the_first_token_keeps_the_prompt() -> None:
    router = make_router()
    w = run(router, rr("1", (1, 2, 3)), 0, first=True, ok=False)  # e.g. the client aborted the stream
    assert router.index.match((1, 2, 3)) == {w: 3}  # the engine computed the whole prompt
    assert router.load.in_flight(w) == 0


def test_extension_blocks_are_indexed_for_the_next_turn() -> None:
    router = make_router()
    w = run(router, rr("1", (1, 2)), 0, extension_blocks=(1, 2, 3, 4))
    assert router.index.match((1, 2, 3, 4, 5)) == {w: 4}


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


# ------------------------------------------------------------ retune (SIGHUP reloads)


def settings_with(**kw: object) -> RoutingSettings:
    return RoutingSettings.model_validate(
        {"keys": {"block_tokens": 16}, "index": {"worker_capacity_tokens": 16 * 100}, **kw}
    )


def test_retune_changes_knobs_and_keeps_the_index() -> None:
    router = make_router()
    run(router, rr("r1", (1, 2, 3)), 0.0)
    untouched = router.policies["random"]
    prefix_before = router.policies["prefix"]
    router.retune(settings_with(policy="round_robin", policies={"prefix": {"load_factor": 3.0}}))
    assert router.cfg.policy == "round_robin" and router.cfg.knobs("prefix").load_factor == 3.0  # type: ignore[attr-defined]
    assert router.policies["prefix"] is not prefix_before  # rebuilt with its new knobs
    assert router.policies["random"] is untouched  # unchanged knobs: kept
    assert router.index.match((1, 2, 3))  # what was indexed stays
    assert router.route(rr("r2", (9,)), ["a", "b", "c"], 1.0).branch == "round_robin"


@pytest.mark.parametrize(
    "change",
    [
        {"keys": {"block_tokens": 32}},
        {"index": {"worker_capacity_tokens": 16 * 100, "max_total_blocks": 5}},
        {"trackers": {"max_tracked_requests": 5}},
        {"sessions": {"max_sessions": 5}},
    ],
)
def test_retune_refuses_what_sizes_live_state(change: dict[str, object]) -> None:
    router = make_router()
    with pytest.raises(ValueError):
        router.retune(settings_with(**{"keys": {"block_tokens": 16}, **change}))
    assert router.cfg.keys.block_tokens == 16


def test_retune_switches_tenant_isolation_for_new_requests() -> None:
    router = make_router()
    body = {"model": "m", "prompt": "p" * 2000}
    shared = router.keys.build("completions", body, route_id="1", tenant="a")
    router.retune(settings_with(keys={"block_tokens": 16, "isolate_tenants": True}))
    a = router.keys.build("completions", body, route_id="2", tenant="a")
    b = router.keys.build("completions", body, route_id="3", tenant="b")
    assert set(a.blocks).isdisjoint(b.blocks) and set(a.blocks).isdisjoint(shared.blocks)
    router.retune(settings_with(keys={"block_tokens": 16, "isolate_tenants": False}))
    assert router.keys.build("completions", body, route_id="4", tenant="b").blocks == shared.blocks


@pytest.mark.parametrize("block_chars", [64, 256, 1024])
def test_a_repeated_text_prompt_is_predicted_whole_whatever_the_block_size(block_chars: int) -> None:
    """A matched block is worth the tokens of text it holds (block_chars / chars_per_token), in every mode,
    once the model has reported (before, the conservative prior: half of it)."""
    keys = {"block_tokens": block_chars // 4}  # 4 characters a token
    router = Router(RoutingSettings.model_validate({"keys": keys}), random.Random(0))
    router.add_worker("a")
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 16_384}]}
    first = router.keys.build("chat", body, route_id="1")
    router.dispatched(first, router.route(first, ["a"], 0), 0)
    again = router.keys.build("chat", body, route_id="2")
    predicted = router.route(again, ["a"], 1).predicted_tokens
    assert (again.key_tokens - block_chars / 4) / 2 <= predicted <= again.key_tokens / 2
    assert router.learn_units("m", "a", first.key_tokens, first.key_tokens, first.counts[-1])
    predicted = router.route(router.keys.build("chat", body, route_id="3"), ["a"], 2).predicted_tokens
    assert again.key_tokens - block_chars / 4 <= predicted <= again.key_tokens


def test_the_prompt_estimate_is_made_once_at_route_and_counted_at_dispatch() -> None:
    """A decision carries the prompt's estimated engine tokens; dispatch counts its uncached part as pending
    prefill without estimating again (a learned value that moves in between does not change the count),
    and a decision made elsewhere (no estimate) is estimated at dispatch."""
    router = Router(RoutingSettings(), random.Random(0), units=UnitTuning(warmup=1))
    router.add_worker("a")
    body = {"model": "m", "messages": [{"role": "user", "content": "word " * 1_000}]}
    req = router.keys.build("chat", body, route_id="1")
    assert (
        router.route(req, ["a"], 0).estimated_prompt_tokens
        == router.estimated_prompt_tokens(req)
        == req.key_tokens
    )
    decision = router.route(req, ["a"], 0)
    assert decision.estimated_prompt_tokens is not None
    learn = router.keys.build("chat", body, route_id="learn")  # teaches: 2 engine tokens per key token
    router.dispatched(learn, router.route(learn, ["a"], 0), 0)
    router.finished(learn, "a", Outcome(True, None, (), 2 * learn.key_tokens), 0)
    assert router.estimated_prompt_tokens(req) > decision.estimated_prompt_tokens
    router.dispatched(req, decision, 1)
    assert router.load.snapshot("a", 1).pending_prefill_tokens == decision.estimated_prompt_tokens
    other = router.keys.build("chat", {**body, "model": "n"}, route_id="2")
    router.dispatched(other, Decision("a", Branch.LEAST_LOAD), 1)
    assert router.load.snapshot("a", 1).pending_prefill_tokens == (
        decision.estimated_prompt_tokens + router.estimated_prompt_tokens(other)
    )
