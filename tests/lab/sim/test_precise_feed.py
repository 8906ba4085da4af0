"""Precise mode in the simulator (simulated engines): the event-fed views mirror the simulated caches
block for block, predictions on them are what the engines then report, messages reach the router one
lag after they were sent, and after a restart or a cache reset no request is routed for a prefix the
engine no longer holds once the fault's message has arrived."""

from __future__ import annotations

import pytest

from prefix_router.lab.sim.events import Fault
from prefix_router.lab.sim.kvcache import PrefixCache
from prefix_router.lab.sim.precise_feed import EventFeed
from prefix_router.lab.sim.profiles import get_profile
from prefix_router.lab.sim.run import workload_scenario
from prefix_router.lab.sim.simulator import ClusterSimulation, ClusterSpec, Record
from prefix_router.routing import Router, RoutingSettings


def test_the_cache_tells_its_listener_what_it_stores_evicts_and_resets() -> None:
    cache = PrefixCache(capacity_blocks=3, block_tokens=4)
    seen: list[tuple[str, int]] = []
    cache.listener = lambda kind, block: seen.append((kind, block))
    assert cache.allocate([1, 2], 2) is not None
    cache.mark_computed([1, 2])
    cache.release([1, 2], 0)
    assert cache.allocate([5, 6, 7], 3) is not None  # evicts both: 2 first (a prefix's tail goes first)
    cache.mark_computed([5, 6, 7])
    cache.release([5, 6, 7], 0)
    cache.reset()
    assert seen == [
        ("stored", 1), ("stored", 2), ("removed", 2), ("removed", 1),
        ("stored", 5), ("stored", 6), ("stored", 7), ("cleared", 0),
    ]  # fmt: skip


def one_engine(lag_s: float = 0.0, max_pending: int = 1_000) -> tuple[Router, EventFeed, PrefixCache]:
    router = Router(
        RoutingSettings.model_validate({"keys": {"mode": "events"}, "events": {"block_tokens": 4}})
    )
    router.add_worker("w")
    feed = EventFeed(router, ["w"], 4, lag_s=lag_s, max_pending=max_pending)
    cache = PrefixCache(capacity_blocks=2, block_tokens=4)
    feed.attach(0, cache)
    return router, feed, cache


def store(cache: PrefixCache, blocks: list[int]) -> None:
    assert cache.allocate(blocks, len(blocks)) is not None
    cache.mark_computed(blocks)
    cache.release(blocks, 0)


def test_a_message_reaches_the_router_one_lag_after_it_was_sent_in_the_order_sent() -> None:
    router, feed, cache = one_engine(lag_s=0.01)
    store(cache, [1, 2])  # sent at 0
    assert router.precise.held_blocks("w") == 0 and feed.in_transit() == 2
    assert feed.deliver(0.009) == 0 and router.precise.held_blocks("w") == 0
    assert feed.deliver(0.01) == 2 and router.precise.held_blocks("w") == 2
    feed.now = 1.0
    store(cache, [7, 8])  # evicts 2 then 1, stores 7 and 8: 4 messages
    assert feed.deliver(1.005) == 0 and router.precise.held_blocks("w") == 2  # still the old view
    assert feed.deliver(2.0) == 4 and router.precise.held_blocks("w") == 2
    assert router.precise.stats("w").removed_blocks == 2


def test_messages_in_transit_are_bounded() -> None:
    _, _, cache = one_engine(lag_s=1.0, max_pending=2)
    store(cache, [1, 2])  # two messages in transit: at the bound
    with pytest.raises(OverflowError):
        store(cache, [5])  # evicts one: a third


def test_a_restart_is_not_announced_the_view_clears_at_the_new_process_first_message() -> None:
    router, feed, cache = one_engine()
    store(cache, [1, 2])
    feed.now = 5.0
    feed.restart(0, cache.reset)
    assert router.precise.held_blocks("w") == 2 and feed.cleared_at == [None]  # the router cannot know
    feed.now = 6.0
    store(cache, [3])
    assert router.precise.held_blocks("w") == 1 and feed.cleared_at == [6.0]
    assert router.precise.stats("w").restarts == 1
    feed.now = 7.0
    cache.reset()  # a reset is announced
    assert router.precise.held_blocks("w") == 0 and feed.cleared_at == [7.0]


def simulation(
    faults: list[tuple[float, Fault]], precise: bool = True, lag_s: float = 0.0
) -> ClusterSimulation:
    spec = ClusterSpec(4, get_profile("llama-3.1-8b-h100"), 6_000, seed=5)
    scenario = workload_scenario("chatbots", spec, 1.0, 300)
    return ClusterSimulation(
        spec,
        "prefix",
        scenario.make_source(),
        scenario.routing("prefix"),
        precise=precise,
        faults=faults,
        event_lag_s=lag_s,
    )


def misrouted(sim: ClusterSimulation) -> list[Record]:
    block = sim.source.engine_block_tokens
    return [r for r in sim.records if r.predicted > r.cached + block]


def test_the_event_fed_views_mirror_the_caches_and_predict_what_engines_report() -> None:
    sim = simulation([])
    sim.run()
    for name, engine in zip(sim.names, sim.engines, strict=True):
        assert sim.router.precise.held_blocks(name) == engine.cache.cached_blocks
        assert sim.router.precise.stats(name).orphan_blocks == 0
    assert sum(e.cache.evictions for e in sim.engines) > 0  # the cells evict
    assert not misrouted(sim)


FAULTS = [(10.0, Fault(0, "restart")), (20.0, Fault(1, "reset")), (30.0, Fault(2, "restart"))]


@pytest.mark.parametrize("lag_s", [0.0, 0.5])
def test_after_a_fault_requests_are_misrouted_only_until_its_message_arrives(lag_s: float) -> None:
    sim = simulation(FAULTS, lag_s=lag_s)
    sim.run()
    assert sim.feed is not None
    cleared = sim.feed.cleared_at
    assert sim.router.precise.stats("engine-000").restarts == 1
    assert sim.router.precise.stats("engine-001").clears == 1
    assert cleared[1] == pytest.approx(20.0 + lag_s)  # a reset: announced at once, one lag to arrive
    window = {f.instance: (at, cleared[f.instance]) for at, f in FAULTS}
    assert all(end is not None and end >= at for at, end in window.values())
    early = []
    for record in misrouted(sim):
        at, end = window.get(record.instance, (0.0, 0.0))
        assert at < record.arrival <= (end or 0.0), record  # sent before the router could know
        early.append(record)
    if lag_s:  # requests sent while the faults' messages were on the wire went on the old view
        assert early
    approximate = simulation(FAULTS, precise=False)
    approximate.run()
    assert len(misrouted(approximate)) > len(early)  # it never learns
