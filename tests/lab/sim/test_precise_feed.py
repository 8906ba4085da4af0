"""Precise mode in the simulator (simulated engines): the event-fed views mirror the simulated caches
block for block, predictions on them are what the engines then report, and after a restart or a cache
reset no request is routed for a prefix the engine no longer holds."""

from __future__ import annotations

from prefix_router.lab.sim.events import Fault
from prefix_router.lab.sim.kvcache import PrefixCache
from prefix_router.lab.sim.profiles import get_profile
from prefix_router.lab.sim.run import workload_scenario
from prefix_router.lab.sim.simulator import ClusterSimulation, ClusterSpec


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


def simulation(faults: list[tuple[float, Fault]], precise: bool = True) -> ClusterSimulation:
    spec = ClusterSpec(4, get_profile("llama-3.1-8b-h100"), 6_000, seed=5)
    scenario = workload_scenario("chatbots", spec, 1.0, 300)
    return ClusterSimulation(
        spec, "prefix", scenario.make_source(), scenario.routing("prefix"), precise=precise, faults=faults
    )


def test_the_event_fed_views_mirror_the_caches_and_predict_what_engines_report() -> None:
    sim = simulation([])
    sim.run()
    block = sim.source.engine_block_tokens
    for name, engine in zip(sim.names, sim.engines, strict=True):
        assert sim.router.precise.held_blocks(name) == engine.cache.cached_blocks
        assert sim.router.precise.stats(name).orphan_blocks == 0
    assert sum(e.cache.evictions for e in sim.engines) > 0  # the cells evict
    assert all(predicted <= cached + block for _, predicted, cached in sim.records)


def test_after_restarts_and_resets_no_request_is_routed_on_a_view_the_engine_lost() -> None:
    faults = [(20.0, Fault(0, "restart")), (40.0, Fault(1, "reset")), (60.0, Fault(2, "restart"))]
    precise = simulation(faults)
    precise.run()
    block = precise.source.engine_block_tokens
    assert not [a for a, predicted, cached in precise.records if predicted > cached + block]
    assert precise.router.precise.stats("engine-000").restarts == 1
    assert precise.router.precise.stats("engine-001").clears == 1
    approximate = simulation(faults, precise=False)
    approximate.run()
    assert [
        a for a, predicted, cached in approximate.records if predicted > cached + block
    ]  # it cannot see them
