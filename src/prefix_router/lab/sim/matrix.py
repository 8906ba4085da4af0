"""The policy evaluation matrix (simulated): workloads x load levels x cache sizes, every policy per cell.

A *cell* is one workload at one load level (an arrival-rate multiplier) with one KV-cache size per
instance; every policy replays exactly the same requests in it (``simulate``), and the pooled-cache
oracle is computed once. Load levels are named by what the load-only reference (``least_load``) sees:
``cold`` (engines busy about 30 % of the time), ``hot`` (75-90 %) and ``overload`` (arrivals beyond the
fleet's capacity: engine queues grow). The rate multipliers that give those levels were found with
``calibrate`` (``prefix-router sim-matrix --calibrate``) and are fixed in the table below, so every policy
and every run sees the same arrivals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefix_router.lab.sim.profiles import get_profile
from prefix_router.lab.sim.run import ProgressFactory, Scenario, simulate, trace_scenario, workload_scenario
from prefix_router.lab.sim.simulator import ClusterSpec
from prefix_router.lab.workloads.traces import MOONCAKE_FILE, find_trace

LOADS = ("cold", "hot", "overload")
CACHES = ("large", "small")
BASELINES = ("random", "round_robin", "least_load", "power_of_two", "consistent_hash", "sglang_cache_aware")
LOAD_ONLY = ("random", "round_robin", "least_load", "power_of_two")
POLICIES = (*BASELINES, "prefix")
PROFILE = "llama-3.1-8b-h100"


@dataclass(frozen=True, slots=True)
class MatrixWorkload:
    """One row of the matrix: a request shape, its size, its two cache sizes and its three rates."""

    key: str
    description: str
    source: str  # a workload name, or "trace" (the Mooncake conversation trace)
    requests: int
    capacity: Mapping[str, int]  # cache label -> KV tokens per instance
    rate: Mapping[str, float]  # load label -> arrival-rate multiplier
    options: Mapping[str, Any] = field(default_factory=dict)
    instances: int = 4


def default_matrix() -> tuple[MatrixWorkload, ...]:
    """The five workloads of docs/benchmarks.md (rates from ``calibrate``, 4 instances each)."""
    return (
        MatrixWorkload(
            "mooncake", "Mooncake conversation trace (first rows, 512-token blocks)", "trace", 1500,
            {"large": 2_000_000, "small": 500_000}, {"cold": 0.12, "hot": 0.45, "overload": 1.5},
        ),
        MatrixWorkload(
            "sharegpt", "ShareGPT conversations, 60 s of thought between turns", "multi-turn", 2000,
            {"large": 426_335, "small": 32_768}, {"cold": 0.015, "hot": 0.05, "overload": 100.0},
            {"max_user_tokens": 2048, "max_output_tokens": 256, "max_turns": 6, "think_time_s": 60.0},
            instances=2,
        ),
        MatrixWorkload(
            "agents", "tool-calling agents, growing tool outputs", "agents", 2000,
            {"large": 426_335, "small": 12_288}, {"cold": 0.12, "hot": 0.4, "overload": 12.0},
            {"tool_output_tokens": 512},
        ),
        MatrixWorkload(
            "rag-long", "long-document RAG, 30k-120k-token documents, Zipf popularity", "rag", 160,
            {"large": 426_335, "small": 200_000}, {"cold": 0.045, "hot": 0.14, "overload": 0.45},
            {"documents": 24, "document_tokens": 30_000, "document_tokens_max": 120_000, "zipf_s": 1.0},
        ),
        MatrixWorkload(
            "bursty", "bursty multi-tenant mix (per-tenant bursts of 8x)", "bursty", 2000,
            {"large": 426_335, "small": 24_576}, {"cold": 0.14, "hot": 0.7, "overload": 20.0},
        ),
    )  # fmt: skip


def trace_available() -> bool:
    """Whether the Mooncake trace (the first workload) is readable here (``../shared/traces``)."""
    try:
        find_trace(MOONCAKE_FILE, None)
    except FileNotFoundError:
        return False
    return True


def small_matrix() -> tuple[MatrixWorkload, ...]:
    """A small version (tests/lab/sim): fewer requests, the same shapes and levels."""
    sizes = {"mooncake": 400, "sharegpt": 500, "agents": 500, "rag-long": 40, "bursty": 500}
    return tuple(
        MatrixWorkload(
            w.key, w.description, w.source, sizes[w.key], w.capacity, w.rate, w.options, w.instances
        )
        for w in default_matrix()
    )


@dataclass(frozen=True, slots=True)
class Cell:
    workload: MatrixWorkload
    load: str
    cache: str

    @property
    def label(self) -> str:
        return f"{self.workload.key}/{self.load}/{self.cache}"

    def scenario(self, knobs: Mapping[str, Any] | None = None, seed: int = 0) -> Scenario:
        w = self.workload
        spec = ClusterSpec(w.instances, get_profile(PROFILE), w.capacity[self.cache], seed)
        rate = w.rate[self.load]
        if w.source == "trace":
            path = find_trace(MOONCAKE_FILE, None)
            return trace_scenario(path, spec, rate, w.requests, knobs=knobs)
        return workload_scenario(w.source, spec, rate, w.requests, dict(w.options), knobs=knobs)


def cells(
    workloads: Sequence[MatrixWorkload], loads: Sequence[str] = LOADS, caches: Sequence[str] = CACHES
) -> Iterator[Cell]:
    for w in workloads:
        for load in loads:
            for cache in caches:
                yield Cell(w, load, cache)


def run_cell(
    cell: Cell,
    policies: Sequence[str] = POLICIES,
    knobs: Mapping[str, Any] | None = None,
    progress: ProgressFactory | None = None,
) -> dict[str, Any]:
    report = simulate(cell.scenario(knobs), policies, progress)
    return {
        "workload": cell.workload.key,
        "load": cell.load,
        "cache": cell.cache,
        "description": cell.workload.description,
        "options": dict(cell.workload.options),
        "requests": cell.workload.requests,
        "report": report,
    }


# ---------------------------------------------------------------------------------------------- calibration

Probe = Callable[[float], dict[str, Any]]


def busy_fraction(report: Mapping[str, Any], policy: str = "least_load") -> float:
    return float(report["details"][policy]["utilisation"]["busy_fraction"])


def calibrate(
    workload: MatrixWorkload, cache: str = "large", targets: Mapping[str, float] | None = None, steps: int = 7
) -> dict[str, float]:
    """Arrival-rate multipliers at which ``least_load`` keeps the engines busy ``targets`` of the time
    (cold 0.3, hot 0.8), by bisection on the logarithm of the rate; overload is 3 x hot."""
    goals = dict(targets or {"cold": 0.3, "hot": 0.8})
    probe = _probe(workload, cache)
    found = {level: _bisect(probe, goal, steps) for level, goal in goals.items()}
    found["overload"] = 3.0 * found.get("hot", 1.0)
    return found


def _probe(workload: MatrixWorkload, cache: str) -> Probe:
    def run(rate: float) -> dict[str, Any]:
        scaled = MatrixWorkload(
            workload.key, workload.description, workload.source, workload.requests,
            workload.capacity, {"probe": rate}, workload.options, workload.instances,
        )  # fmt: skip
        return simulate(Cell(scaled, "probe", cache).scenario(), ["least_load"])

    return run


def _bisect(probe: Probe, goal: float, steps: int, low: float = 0.01, high: float = 100.0) -> float:
    lo, hi = math.log(low), math.log(high)
    for _ in range(steps):
        mid = (lo + hi) / 2.0
        if busy_fraction(probe(math.exp(mid))) < goal:
            lo = mid
        else:
            hi = mid
    return round(math.exp((lo + hi) / 2.0), 3)


def write_json(path: str | Path, document: Mapping[str, Any]) -> None:
    import json

    Path(path).write_text(json.dumps(document, indent=1) + "\n")
