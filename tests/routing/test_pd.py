"""The two-stage choice of prefill/decode disaggregation and its decider (``routing/pd.py``)."""

from __future__ import annotations

import pytest

from prefix_router.routing import PdDecision, SkipReason, skip_prefill
from prefix_router.routing.router import Router
from prefix_router.routing.types import Branch, Decision, Outcome, RouteRequest
from support.routing import new_router, prefix
from support.routing import route_request as rr

PREFILL = ["p1", "p2"]
DECODE = ["d1", "d2"]


def pd_router(**settings: object) -> Router:
    return new_router({"keys": {"block_tokens": 16}, **settings}, (*PREFILL, *DECODE))


def serve(router: Router, req: RouteRequest, pd: PdDecision, now: float) -> None:
    """Run the decision's stages as the edge does: each dispatched, first token, finished."""
    stages = [pd.decode] if pd.prefill is None else [pd.prefill, pd.decode]
    for decision in stages:
        router.dispatched(req, decision, now)
        router.first_token(req.route_id, now)
        router.finished(req, decision.worker, Outcome(), now)


def test_a_cold_prompt_is_never_skipped_and_goes_to_both_pools() -> None:
    router = pd_router()
    pd = router.route_pd(rr("1", prefix(1, 2)), PREFILL, DECODE, 0, skip_prefill_tokens=10_000)
    assert pd.skipped is None and not pd.colocated
    assert pd.prefill is not None and pd.prefill.worker in PREFILL and pd.decode.worker in DECODE


def test_the_prefill_stage_follows_the_prefix_and_the_decode_stage_too() -> None:
    router = pd_router()
    first = router.route_pd(rr("1", prefix(1, 8)), PREFILL, DECODE, 0, skip_prefill_tokens=0)
    serve(router, rr("1", prefix(1, 8)), first, 0)
    assert first.prefill is not None
    # the same long prefix, a new question: both stages go back where it is cached
    again = router.route_pd(rr("2", (*prefix(1, 8), 77)), PREFILL, DECODE, 1, skip_prefill_tokens=0)
    assert again.prefill is not None and again.prefill.worker == first.prefill.worker
    assert again.prefill.branch == Branch.PREFIX_HIT and again.prefill.predicted_tokens == 8 * 16
    assert again.decode.worker == first.decode.worker and again.decode.predicted_tokens == 8 * 16


def test_the_decider_skips_prefill_when_the_decode_worker_holds_all_but_the_threshold() -> None:
    router = pd_router()
    first = router.route_pd(rr("1", prefix(1, 8)), PREFILL, DECODE, 0, skip_prefill_tokens=32)
    serve(router, rr("1", prefix(1, 8)), first, 0)
    # 2 new blocks (32 tokens) + a 5-token tail beyond the 8 held: 37 uncached > 32, prefilled
    long_turn = rr("2", (*prefix(1, 8), 901, 902))
    assert router.route_pd(long_turn, PREFILL, DECODE, 1, skip_prefill_tokens=32).skipped is None
    # 1 new block + the tail: 21 uncached <= 32, straight to the decode worker holding it
    short_turn = rr("3", (*prefix(1, 8), 901))
    pd = router.route_pd(short_turn, PREFILL, DECODE, 1, skip_prefill_tokens=32)
    assert pd.skipped == SkipReason.DECODE_HOLDS_PREFIX and pd.prefill is None
    assert pd.decode.worker == first.decode.worker


def test_without_prefill_workers_it_runs_colocated_on_decode() -> None:
    router = pd_router()
    pd = router.route_pd(rr("1", prefix(1)), [], DECODE, 0)
    assert pd.skipped == SkipReason.NO_PREFILL_WORKER and pd.decode.worker in DECODE


def test_without_decode_workers_it_runs_colocated_on_a_prefill_worker() -> None:
    router = pd_router()
    pd = router.route_pd(rr("1", prefix(1)), PREFILL, [], 0)
    assert pd.skipped == SkipReason.NO_DECODE_WORKER and pd.decode.worker in PREFILL
    with pytest.raises(ValueError):
        router.route_pd(rr("2", prefix(1)), [], [], 0)


def test_each_stage_takes_its_own_policy() -> None:
    router = pd_router()
    pd = router.route_pd(rr("1", prefix(1)), PREFILL, DECODE, 0, policy="round_robin", decode_policy="random")
    assert pd.prefill is not None and pd.prefill.branch == Branch.ROUND_ROBIN
    assert pd.decode.branch == Branch.RANDOM


def test_the_decode_stage_is_load_aware() -> None:
    """With no prefix anywhere, the decode stage goes to the less loaded decode worker."""
    router = pd_router()
    busy = rr("busy", prefix(5))
    router.dispatched(busy, Decision("d1", Branch.LOAD_BALANCE), 0)
    for i in range(3):
        pd = router.route_pd(rr(f"r{i}", prefix(10 + i)), PREFILL, DECODE, 0)
        assert pd.decode.worker == "d2"


@pytest.mark.parametrize(
    ("cached", "prompt", "threshold", "skips"),
    [(0, 10, 100, False), (96, 100, 4, True), (96, 101, 4, False), (100, 100, 0, True), (50, 100, 0, False)],
)
def test_skip_prefill(cached: int, prompt: int, threshold: int, skips: bool) -> None:
    decision = Decision("d", Branch.PREFIX_HIT, predicted_tokens=cached)
    assert skip_prefill(decision, prompt, threshold) is skips


def test_a_handed_over_decode_holds_the_prompts_whole_engine_blocks() -> None:
    router = pd_router()
    req = rr("1", prefix(1, 20), tail=0)  # 320 tokens
    pd = router.route_pd(req, PREFILL, DECODE, 0)
    assert pd.decode.predicted_tokens == 0
    handed = router.handed_over(req, pd.decode)
    assert handed.worker == pd.decode.worker and handed.predicted_tokens == 320
    assert handed.expected_cached_tokens == 320  # its load is charged no prefill
    router.set_engine_block(pd.decode.worker, 128)
    assert router.handed_over(req, pd.decode).predicted_tokens == 256  # whole blocks of 319 tokens
