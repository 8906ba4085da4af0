from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefix_router.lab.sim.engine import EngineModel, EngineRequest, RequestRejected
from prefix_router.lab.sim.profiles import EngineProfile, get_profile


def test_a_repeated_prefix_is_cached(demo_profile: EngineProfile, kit: Any) -> None:
    engine = EngineModel(demo_profile)
    shared = kit.chain("system", 20)
    _, end, cached_first = kit.run_one(engine, kit.request("a", shared + kit.chain("a", 5), 16), 0.0)
    _, _, cached_second = kit.run_one(engine, kit.request("b", shared + kit.chain("b", 5), 16), end + 1)
    assert cached_first == 0
    assert cached_second == 20 * 16
    assert engine.stats.prefix_hits == 20 * 16


def test_generated_tokens_are_cached_for_the_next_turn(demo_profile: EngineProfile, kit: Any) -> None:
    engine = EngineModel(demo_profile)
    prompt = kit.chain("conv", 10)
    turn = EngineRequest("t1", 10 * 16 + 5, 40, prompt, kit.chain("conv", 12))
    _, end, _ = kit.run_one(engine, turn, 0.0)
    follow = kit.request("t2", kit.chain("conv", 14), 16)
    _, _, cached = kit.run_one(engine, follow, end + 1)
    assert cached == 12 * 16


def test_eviction_under_pressure_follows_lru(demo_profile: EngineProfile, kit: Any) -> None:
    engine = EngineModel(demo_profile, capacity_tokens=64 * 16)  # 64 blocks
    now = 0.0
    for name in ("old", "mid", "new"):  # 3 prompts of 20 blocks (+ 1 private each while running)
        _, now, _ = kit.run_one(engine, kit.request(name, kit.chain(name, 20), 16), now + 1)
    _, now, hit_old = kit.run_one(engine, kit.request("old2", kit.chain("old", 20), 16), now + 1)
    assert hit_old == 20 * 16  # "old" is refreshed, "mid" is now least recently used
    _, now, _ = kit.run_one(engine, kit.request("x", kit.chain("x", 20), 16), now + 1)
    assert engine.cache.match(kit.chain("mid", 20)) < 20
    assert engine.cache.match(kit.chain("old", 20)) == 20
    assert engine.cache.match(kit.chain("new", 20)) == 20
    assert engine.cache.used_blocks <= 64


def test_timing_grows_with_uncached_tokens(demo_profile: EngineProfile, kit: Any) -> None:
    ttfts = []
    for uncached in (0, 8, 32, 96):
        engine = EngineModel(demo_profile)
        shared = kit.chain("doc", 100)
        kit.run_one(engine, kit.request("warm", shared, 16), 0.0)
        prompt = shared[: 100 - uncached] + kit.chain("new", uncached)
        ttft, _, cached = kit.run_one(engine, kit.request("probe", prompt, 16), 100.0)
        assert cached == (100 - uncached) * 16
        ttfts.append(ttft)
    assert ttfts == sorted(ttfts) and len(set(ttfts)) == len(ttfts)


def test_decode_pace_slows_with_batch_size(demo_profile: EngineProfile, kit: Any) -> None:
    def decode_time(batch: int) -> float:
        engine = EngineModel(demo_profile)
        for i in range(batch):
            engine.submit(kit.request(f"r{i}", kit.chain(f"r{i}", 2), 16, output=200), 0.0)
        events = kit.run_until_idle(engine)
        first = max(e[2] for e in events if e[0] == "first_token")
        return max(e[2] for e in events if e[0] == "finished") - first

    assert decode_time(32) > decode_time(1)


def test_chunked_prefill_respects_the_token_budget(demo_profile: EngineProfile, kit: Any) -> None:
    profile = dataclasses.replace(demo_profile, max_num_batched_tokens=256)
    engine = EngineModel(profile)
    engine.submit(kit.request("long", kit.chain("long", 64), 16), 0.0)  # 1032 tokens: 5 chunks
    steps = 0
    while not any(e.kind == "first_token" for e in engine.advance()):
        steps += 1
    assert steps + 1 == 5


def test_max_num_seqs_bounds_the_running_batch(demo_profile: EngineProfile, kit: Any) -> None:
    profile = dataclasses.replace(demo_profile, max_num_seqs=4)
    engine = EngineModel(profile)
    for i in range(10):
        engine.submit(kit.request(f"r{i}", kit.chain(f"r{i}", 1), 16, output=50), 0.0)
    seen = 0
    while engine.next_time() is not None:
        engine.advance()
        assert engine.num_running <= 4
        seen = max(seen, engine.num_running)
    assert seen == 4 and engine.stats.finished == 10


def test_waiting_queue_is_bounded(demo_profile: EngineProfile, kit: Any) -> None:
    engine = EngineModel(dataclasses.replace(demo_profile, max_num_seqs=1), max_waiting=3)
    for i in range(4):  # one runs, three wait
        engine.submit(kit.request(f"r{i}", (), 16), 0.0)
    assert engine.num_waiting == 3
    with pytest.raises(RequestRejected):
        engine.submit(kit.request("r4", (), 16), 0.0)


def test_too_long_requests_are_rejected(demo_profile: EngineProfile, kit: Any) -> None:
    engine = EngineModel(demo_profile, capacity_tokens=1024)
    with pytest.raises(RequestRejected):
        engine.submit(kit.request("big", kit.chain("big", 80), 16), 0.0)
    with pytest.raises(RequestRejected):
        engine.submit(EngineRequest("long", demo_profile.max_model_len, 10, ()), 0.0)
    assert engine.stats.rejected == 2


def test_cancelled_requests_leave_the_batch_and_free_memory(demo_profile: EngineProfile, kit: Any) -> None:
    engine = EngineModel(demo_profile)
    engine.submit(kit.request("keep", kit.chain("keep", 4), 16, output=500), 0.0)
    engine.submit(kit.request("drop", kit.chain("drop", 4), 16, output=500), 0.0)
    engine.advance()
    engine.advance()
    assert engine.num_running == 2
    assert engine.generated("drop") > 0
    assert engine.cancel("drop", 0.1)  # mid-span: takes effect at the next step boundary
    cut = engine.next_time()
    engine.advance()
    assert cut is not None and 0.1 <= cut < 0.2
    assert engine.num_running == 1 and "drop" not in engine
    events = kit.run_until_idle(engine)
    assert [e[1] for e in events if e[0] == "finished"] == ["keep"]
    assert engine.cache.active_blocks == 0
    assert engine.stats.cancelled == 1


def test_a_new_arrival_cuts_a_decode_span_short(demo_profile: EngineProfile, kit: Any) -> None:
    engine = EngineModel(demo_profile)
    engine.submit(kit.request("long", (), 16, output=1000), 0.0)
    engine.advance()  # prefill; now one long decode span
    span_end = engine.next_time()
    assert span_end is not None and span_end > 1.0
    engine.submit(kit.request("late", (), 16, output=2), 0.5)
    cut = engine.next_time()
    assert cut is not None and 0.5 <= cut < span_end


requests = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 30), st.integers(1, 200), st.integers(1, 30)),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(requests, st.integers(8, 200))
def test_cached_tokens_never_exceed_the_prompt(
    reqs: list[tuple[int, int, int, int]], capacity_blocks: int
) -> None:
    from prefix_router.lab.sim.profiles import get_profile

    engine = EngineModel(get_profile("cpu-demo"), capacity_tokens=capacity_blocks * 16)
    prompts = {}
    for i, (family, n_blocks, extra, output) in enumerate(reqs):
        blocks = tuple(family * 10_000 + b for b in range(n_blocks))
        req = EngineRequest(f"r{i}", n_blocks * 16 + extra, output, blocks)
        prompts[req.request_id] = req.prompt_tokens
        try:
            engine.submit(req, float(i) * 0.001)
        except RequestRejected:
            prompts.pop(req.request_id)
        while (end := engine.next_time()) is not None and end <= (i + 1) * 0.001:
            _check(engine.advance(), prompts)
    while engine.next_time() is not None:
        _check(engine.advance(), prompts)
    assert engine.cache.used_blocks <= engine.cache.capacity_blocks
    assert engine.stats.finished == len(prompts)


def _check(events: list[Any], prompts: dict[str, int]) -> None:
    for event in events:
        assert 0 <= event.cached_tokens < prompts[event.request_id]


def test_busy_time_adds_up_the_work_not_the_idle_gaps(demo_profile: EngineProfile, kit: Any) -> None:
    engine = EngineModel(demo_profile)
    _, end, _ = kit.run_one(engine, kit.request("a", kit.chain("a", 10), 16, output=20), 0.0)
    assert engine.stats.busy_s == pytest.approx(end)  # busy from its arrival at 0 to its end
    _, end2, _ = kit.run_one(engine, kit.request("b", kit.chain("b", 10), 16, output=20), end + 100.0)
    assert engine.stats.busy_s == pytest.approx(end + (end2 - end - 100.0))  # the 100 s idle gap is not busy


def test_computed_chunks_are_hits_before_the_prompt_ends(demo_profile: EngineProfile, kit: Any) -> None:
    """As vLLM V1 caches full blocks as chunks are computed, a request admitted while a long prompt is
    still being prefilled reuses the chunks already done."""
    profile = dataclasses.replace(demo_profile, max_num_batched_tokens=256)
    engine = EngineModel(profile)
    doc = kit.chain("doc", 64)  # 1,024 tokens: four full chunks of 256
    engine.submit(kit.request("first", doc + kit.chain("q1", 1), 16), 0.0)
    engine.advance()
    engine.advance()  # two chunks (512 tokens, 32 blocks) computed
    engine.submit(kit.request("second", doc + kit.chain("q2", 1), 16), engine.next_time() or 0.0)
    events = kit.run_until_idle(engine)
    cached = next(e[3] for e in events if e[0] == "finished" and e[1] == "second")
    assert cached >= 32 * 16


def test_the_engine_reports_queue_waits_and_busy_time(demo_profile: EngineProfile, kit: Any) -> None:
    profile = dataclasses.replace(demo_profile, max_num_seqs=1)
    engine = EngineModel(profile)
    engine.submit(kit.request("a", kit.chain("a", 4), 16, output=20), 0.0)
    engine.submit(kit.request("b", kit.chain("b", 4), 16, output=20), 0.0)
    events = []
    while engine.next_time() is not None:
        events.extend(engine.advance())
    waits = {e.request_id: e.queued_s for e in events if e.kind == "finished"}
    end = max(e.time for e in events)
    assert waits["a"] == 0.0
    assert waits["b"] == pytest.approx(
        next(e.time for e in events if e.kind == "finished" and e.request_id == "a")
    )
    assert engine.stats.busy_s == pytest.approx(end)  # never idle from 0 to the end
    assert 0 < engine.stats.prefill_s < engine.stats.busy_s


def test_a_kv_handoff_loads_blocks_as_cached_with_its_transfer_time() -> None:
    profile = get_profile("cpu-demo")
    engine = EngineModel(profile, capacity_tokens=1024)
    blocks = (11, 12, 13, 14)
    assert engine.load(blocks[:3]) == 3 and engine.load(blocks[:3]) == 0  # held already: nothing moves
    assert engine.load(blocks) == 1
    assert (
        engine.transfer_time(64) == pytest.approx(64 * profile.kv_transfer_s_per_token)
        and engine.transfer_time(64) > 0
    )
    engine.submit(EngineRequest("r", 70, 2, blocks), 0.0)
    events = []
    while (end := engine.next_time()) is not None:
        events += engine.advance()
        assert end >= 0
    assert [e.cached_tokens for e in events if e.kind == "first_token"] == [64]


def test_a_handoff_that_finds_no_room_loads_nothing() -> None:
    engine = EngineModel(get_profile("cpu-demo"), capacity_tokens=32)  # two blocks
    assert engine.load((1, 2, 3)) == 0 and engine.cache.match((1, 2, 3)) == 0
