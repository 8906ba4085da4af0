"""Token units of text keys (``routing/units.py``): learned per model from engine reports (moving average
less a margin of deviations, clamped samples, warm-up, bounded table), and applied by the router wherever
a key's tokens are used: the prediction, the load tracker, the policy's cost and the index's capacity."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings, UnitSettings
from prefix_router.routing.types import Outcome, RouteRequest
from prefix_router.routing.units import CLAMP, TokenUnits

BLOCKS = 100  # blocks of 16 nominal tokens (64 characters at 4 per token)


def units(**knobs: object) -> TokenUnits:
    return TokenUnits(UnitSettings.model_validate(knobs), chars_per_token=4.0)


def text_req(rid: str, tag: int = 1, blocks: int = BLOCKS, model: str | None = "m") -> RouteRequest:
    chain = tuple(tag * 10_000 + i for i in range(blocks))
    return RouteRequest(rid, chain, 16, 16 * blocks + 3, chain[0], text_model=model)


def make_router(**units_knobs: object) -> Router:
    cfg = RoutingSettings.model_validate(
        {"index": {"worker_capacity_tokens": 16 * 1000}, "units": units_knobs}
    )
    router = Router(cfg, random.Random(0))
    router.add_worker("a")
    return router


def serve(router: Router, req: RouteRequest, engine_tokens: int | None, now: float = 0.0) -> int:
    decision = router.route(req, ["a"], now)
    router.dispatched(req, decision, now)
    router.first_token(req.request_id, now)
    router.finished(req, "a", Outcome(True, None, (), engine_tokens), now)
    return decision.predicted_tokens


# ---------------------------------------------------------------- learning


def test_nothing_is_used_before_the_warmup_and_then_the_average_less_the_margin() -> None:
    table = units(warmup=4, margin=1.0)
    samples = [0.78, 0.82, 0.8, 0.8]
    for i, sample in enumerate(samples):
        assert table.scale("m") == 1.0  # not yet: the configured chars_per_token
        assert table.observe("m", 1000, round(sample * 1000))
        assert (table.scale("m") == 1.0) is (i < 3)
    mean = sum(samples) / 4
    deviation = math.sqrt(sum((s - mean) ** 2 for s in samples) / 4)
    assert table.scale("m") == pytest.approx(mean - deviation, abs=1e-9)
    assert table.summary()["m"]["chars_per_token"] == pytest.approx(4.0 / mean)
    assert table.scale("other") == 1.0 and table.scale(None) == 1.0


def test_the_average_moves_by_alpha_once_past_its_window() -> None:
    table = units(alpha=0.25, warmup=1, margin=0.0)
    for _ in range(8):
        table.observe("m", 1000, 800)
    table.observe("m", 1000, 1200)
    assert table.scale("m") == pytest.approx(0.8 + 0.25 * 0.4)


@given(st.lists(st.integers(1, 1 << 31), min_size=1, max_size=50))
def test_samples_are_clamped_so_no_report_moves_the_scale_out_of_its_bounds(reports: list[int]) -> None:
    table = units(warmup=1, margin=0.0)
    for reported in reports:
        table.observe("m", 1000, reported)
    assert 1 / CLAMP <= table.scale("m") <= CLAMP
    assert table.summary()["m"]["clamped"] == sum(not 250 <= r <= 4000 for r in reports)


def test_short_prompts_insane_reports_and_learning_off_teach_nothing() -> None:
    table = units(min_sample_tokens=512, warmup=1)
    assert not table.observe("m", 511, 400)  # a template's tokens would weigh too much
    assert not table.observe("m", 1000, None)  # the engine reported no usage
    assert not table.observe("m", 1000, 0) and not table.observe("m", 1000, -5)
    assert not table.observe("m", 1000, (1 << 31) + 1)
    assert len(table) == 0 and table.scale("m") == 1.0
    off = units(learn=False, warmup=1)
    assert not off.observe("m", 1000, 800) and off.scale("m") == 1.0


def test_the_table_holds_at_most_max_models_dropping_the_least_recently_reported() -> None:
    table = units(max_models=3, warmup=1, margin=0.0)
    for i in range(10):
        table.observe(f"model-{i}", 1000, 800)
        assert len(table) <= 3 and len(table.scales) <= 3
    table.observe("model-7", 1000, 800)  # reported again: the most recent
    table.observe("model-new", 1000, 800)
    assert set(table.summary()) == {"model-9", "model-7", "model-new"}
    assert table.scale("model-8") == 1.0  # its learned value went with it


# ---------------------------------------------------------------- the router applies it


def test_after_the_warmup_a_repeat_is_predicted_at_the_engines_count_never_above() -> None:
    router = make_router(margin=0.0)
    nominal = 16 * BLOCKS + 3
    engine = round(nominal / 1.25)  # 5 characters per token where 4 were assumed
    assert serve(router, text_req("first"), engine) == 0
    assert serve(router, text_req("repeat-early"), engine) == 16 * BLOCKS  # before the warm-up: nominal
    for i in range(8):
        serve(router, text_req(f"warm{i}", tag=2 + i), engine)
    got = serve(router, text_req("repeat"), engine)
    assert engine - 16 <= got <= engine
    assert router.summary()["units"]["m"]["samples"] == 11  # type: ignore[index]


def test_the_load_tracker_and_the_drain_count_the_scaled_prompt() -> None:
    router = make_router(warmup=1, margin=0.0)
    serve(router, text_req("teach"), 800 * 2)  # 2 engine tokens per nominal token
    req = text_req("new", tag=7)
    decision = router.route(req, ["a"], 1.0)
    router.dispatched(req, decision, 1.0)
    assert router.prompt_tokens(req) == math.ceil(req.prompt_tokens * router.units.scale("m"))
    assert router.load.snapshot("a", 1.0).pending_prefill_tokens == router.prompt_tokens(req)


def test_token_id_keys_are_never_scaled() -> None:
    router = make_router(warmup=1, margin=0.0)
    serve(router, text_req("teach"), 800)  # text of model m: half a token per nominal token
    ids = text_req("ids", model=None)
    serve(router, ids, 800)  # a token-id key's report teaches nothing ...
    assert router.units.summary()["m"]["samples"] == 1
    assert serve(router, text_req("ids-again", model=None), None) == 16 * BLOCKS  # ... nor is it scaled


def test_the_prefix_policy_weighs_the_scaled_tokens() -> None:
    """Worker "a" holds 30 of the request's 40 blocks and has a request in flight (a fixed penalty of 512
    token-equivalents); "b" is idle. Nominally (643 tokens) recomputing all of it on "b" is cheaper than
    the penalty plus 163 tokens on "a"; where the engine counts twice as many tokens, it is not."""
    chosen = {}
    for learned in (False, True):
        router = make_router(learn=learned, warmup=1, margin=0.0)
        router.add_worker("b")
        serve(router, text_req("teach", tag=50), (16 * BLOCKS + 3) * 2)  # 2 engine tokens per nominal one
        hot = text_req("hot", tag=9, blocks=30)
        router.dispatched(hot, router.route(hot, ["a"], 0.0), 0.0)
        router.first_token("hot", 0.0)  # in flight on "a", its prefill done
        chosen[learned] = router.route(text_req("again", tag=9, blocks=40), ["a", "b"], 0.1).worker
    assert chosen == {False: "b", True: "a"}


def test_the_index_keeps_a_workers_capacity_in_tokens_when_its_blocks_are_worth_less() -> None:
    router = make_router(warmup=1, margin=0.0)
    index = router.index
    assert (index.capacity_blocks("a"), index.ceiling_tokens("a")) == (1000, 16_000)
    serve(router, text_req("teach"), (16 * BLOCKS + 3) * 4 // 5)  # 0.8: a block is 12.8 tokens
    assert index.block_value("a") == pytest.approx(16 * 0.8, rel=1e-3)
    assert index.capacity_blocks("a") == 1250  # 16,000 tokens of 12.8-token blocks
    assert index.ceiling_tokens("a") == index.capacity_tokens("a") == pytest.approx(16_000, abs=13)
    index.set_block_value("a", 12.81)  # a move under 1/64: nothing changes
    assert index.block_value("a") == pytest.approx(12.8, rel=1e-3)
    index.insert("a", tuple(range(1, 901)), 1.0)
    assert index.blocks_of("a") == 1000
    index.set_block_value("a", 32.0)  # denser: fewer blocks fit, the oldest are evicted
    assert index.ceiling_tokens("a") == 16_000 and index.capacity_blocks("a") in (499, 500)
    assert index.blocks_of("a") == index.capacity_blocks("a") and index.evictions == 1000 - index.blocks_of(
        "a"
    )
    router.remove_worker("a")
    router.add_worker("a")
    assert index.block_value("a") == 16  # a new worker of the same name starts nominal


def test_retune_refuses_new_units_knobs() -> None:
    router = make_router()
    with pytest.raises(ValueError, match="units"):
        router.retune(RoutingSettings.model_validate({"units": {"margin": 2.0}}))
