from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from prefix_router.lab.sim.events import Event, EventQueue
from prefix_router.lab.sim.profiles import get_profile
from prefix_router.lab.sim.run import simulate, trace_scenario
from prefix_router.lab.sim.simulator import ClusterSimulation, ClusterSpec

SCHEMA = {
    "requests",
    "errors",
    "hit_rate",
    "predicted_hit_rate",
    "ttft_ms",
    "e2e_ms",
    "throughput_rps",
    "prefill_tokens",
    "load_imbalance",
}


def synthetic_trace(path: Path, rows: int = 240, families: int = 12, seed: int = 3) -> Path:
    """Conversations of a few shared-prefix families, 3 rows per second in 3 s buckets."""
    rng = random.Random(seed)
    next_id = 100_000
    lines = []
    for i in range(rows):
        family = rng.randrange(families)
        shared = [family * 1000 + b for b in range(rng.randint(2, 12))]
        unique = list(range(next_id, next_id + rng.randint(1, 4)))
        next_id += len(unique)
        ids = shared + unique
        record = {
            "timestamp": (i // 9) * 3000,
            "input_length": len(ids) * 512 - 100,
            "output_length": 50,
            "hash_ids": ids,
        }
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


def run(
    path: Path, policies: list[str], seed: int = 0, instances: int = 4, capacity: int = 40_000
) -> dict[str, Any]:
    spec = ClusterSpec(instances, get_profile("llama-3.1-8b-h100"), capacity, seed)
    return simulate(trace_scenario(path, spec), policies)


def without_wall_time(report: dict[str, Any]) -> dict[str, Any]:
    return {
        **report,
        "details": {p: {k: v for k, v in d.items() if k != "wall_s"} for p, d in report["details"].items()},
    }


def test_report_schema_and_completion(tmp_path: Path) -> None:
    report = run(synthetic_trace(tmp_path / "t.jsonl"), ["random", "prefix"])
    assert report["simulated"] is True
    assert set(report["policies"]) == {"random", "prefix"}
    for row in report["policies"].values():
        assert set(row) == SCHEMA
        assert set(row["ttft_ms"]) == {"p50", "p90", "p99", "mean"}
        assert row["requests"] == 240 and row["errors"] == 0
        assert 0.0 <= row["hit_rate"] <= 1.0 and row["load_imbalance"] >= 1.0
    assert 0.0 < report["oracle"]["hit_rate"] <= report["oracle"]["ideal_hit_rate"]


def test_prefix_routing_beats_random_on_shared_prefixes(tmp_path: Path) -> None:
    report = run(synthetic_trace(tmp_path / "t.jsonl"), ["random", "prefix"])
    random_hits = report["policies"]["random"]["hit_rate"]
    prefix_hits = report["policies"]["prefix"]["hit_rate"]
    assert prefix_hits > random_hits
    assert report["policies"]["prefix"]["prefill_tokens"] < report["policies"]["random"]["prefill_tokens"]


def test_deterministic_for_a_fixed_seed(tmp_path: Path) -> None:
    path = synthetic_trace(tmp_path / "t.jsonl")
    first = without_wall_time(run(path, ["random", "prefix"], seed=5))
    second = without_wall_time(run(path, ["random", "prefix"], seed=5))
    other = without_wall_time(run(path, ["random", "prefix"], seed=6))
    assert first == second
    assert first["policies"] != other["policies"]


def test_requests_too_large_for_an_engine_are_errors(tmp_path: Path) -> None:
    report = run(synthetic_trace(tmp_path / "t.jsonl", rows=30), ["round_robin"], capacity=4096)
    row = report["policies"]["round_robin"]
    assert row["errors"] > 0 and row["requests"] + row["errors"] == 30


def test_router_capacity_matches_the_engines(tmp_path: Path) -> None:
    small = run(synthetic_trace(tmp_path / "t.jsonl"), ["prefix"], capacity=20_000)
    large = run(synthetic_trace(tmp_path / "t.jsonl"), ["prefix"], capacity=400_000)
    assert large["policies"]["prefix"]["hit_rate"] > small["policies"]["prefix"]["hit_rate"]
    assert large["oracle"]["hit_rate"] >= small["oracle"]["hit_rate"]


class _Mark(Event):
    __slots__ = ("label", "log")

    def __init__(self, label: str, log: list[str]) -> None:
        self.label, self.log = label, log


def test_event_queue_orders_by_time_then_insertion() -> None:
    queue = EventQueue()
    log: list[str] = []
    for time, label in ((2.0, "c"), (1.0, "a"), (1.0, "b"), (0.5, "first")):
        queue.push(time, _Mark(label, log))
    order = []
    while queue:
        _, event = queue.pop()
        assert isinstance(event, _Mark)
        order.append(event.label)
    assert order == ["first", "a", "b", "c"]


def test_event_queue_is_bounded() -> None:
    queue = EventQueue(capacity=2)
    queue.push(0.0, _Mark("a", []))
    queue.push(0.0, _Mark("b", []))
    with pytest.raises(OverflowError):
        queue.push(0.0, _Mark("c", []))


def test_requests_in_flight_are_bounded(tmp_path: Path) -> None:
    spec = ClusterSpec(2, get_profile("llama-3.1-8b-h100"), 40_000, max_live_requests=3)
    with pytest.raises(OverflowError):
        simulate(trace_scenario(synthetic_trace(tmp_path / "t.jsonl"), spec), ["random"])


def _records(path: Path, policy: str, router_seed: str | None) -> tuple[list[Any], list[Any]]:
    spec = ClusterSpec(4, get_profile("llama-3.1-8b-h100"), 40_000, 5)
    scenario = trace_scenario(path, spec)
    sim = ClusterSimulation(
        spec,
        policy,
        scenario.make_source(),
        scenario.routing(policy),
        keep_arrivals=True,
        router_seed=router_seed,
    )
    result = sim.run()
    return [(r.request_id, r.arrival) for r in result.arrivals], sim.records


def test_the_router_seed_changes_the_routers_choices_alone(tmp_path: Path) -> None:
    path = synthetic_trace(tmp_path / "t.jsonl")
    arrivals, default = _records(path, "random", None)
    assert _records(path, "random", "router:5") == (arrivals, default)  # the default: router:<seed>
    other_arrivals, other = _records(path, "random", "router:5:reseeded")
    assert other_arrivals == arrivals  # the same requests at the same times
    assert [r.instance for r in other] != [r.instance for r in default]
