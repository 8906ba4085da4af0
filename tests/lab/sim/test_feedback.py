"""Engine feedback on the Mooncake trace (simulated): an index that assumes 10x the engines' KV cache (the
worker's size not scraped) learns it from the engines' reports, so its predictions follow what the engines
really served, without costing hit rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prefix_router.lab.sim.profiles import get_profile
from prefix_router.lab.sim.run import trace_scenario
from prefix_router.lab.sim.simulator import ClusterSimulation, ClusterSpec
from prefix_router.lab.sim.stats import summarize
from prefix_router.routing.feedback import FeedbackTuning

TRACE = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
ENGINE_TOKENS, ASSUMED_TOKENS = 100_000, 1_000_000


def run(capacity_step: float) -> dict[str, Any]:
    spec = ClusterSpec(16, get_profile("llama-3.1-8b-h100"), ENGINE_TOKENS, seed=0)
    scenario = trace_scenario(TRACE, spec, limit=3000)
    routing = scenario.routing("prefix")
    tuning = FeedbackTuning(capacity_step=capacity_step)
    sim = ClusterSimulation(spec, "prefix", scenario.make_source(), routing, feedback=tuning)
    for name in sim.names:
        sim.router.set_capacity(name, ASSUMED_TOKENS)
    result = sim.run()
    return {**summarize(result.stats), "workers": result.router_summary["workers"]}


def test_predictions_follow_the_engines_when_the_index_assumes_too_much() -> None:
    if not TRACE.exists():  # the shared traces beside the checkout are required, never skipped
        pytest.fail(f"the shared trace is missing: {TRACE}")
    learned, blind = run(0.1), run(0.0)
    gap = learned["predicted_hit_rate"] - learned["hit_rate"]
    blind_gap = blind["predicted_hit_rate"] - blind["hit_rate"]
    assert gap < 0.5 * blind_gap
    assert learned["hit_rate"] >= 0.9 * blind["hit_rate"]
    capacities = [w["capacity_tokens"] for w in learned["workers"].values()]
    assert max(capacities) < ASSUMED_TOKENS and min(capacities) >= FeedbackTuning().min_capacity_tokens
