"""``simulate``: run every policy over the same requests, then the pooled-cache oracle (simulated)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefix_router.lab.sim.decision_log import DecisionLog
from prefix_router.lab.sim.openai_api import EngineLimits
from prefix_router.lab.sim.oracle import oracle
from prefix_router.lab.sim.pd_sim import PdSpec
from prefix_router.lab.sim.requests import RequestSource, TraceSource
from prefix_router.lab.sim.simulator import ClusterSimulation, ClusterSpec, ProgressHook
from prefix_router.lab.sim.stats import details, summarize
from prefix_router.lab.sim.trace import read_trace, tile
from prefix_router.protocol import MOONCAKE_BLOCK_TOKENS
from prefix_router.routing import RoutingSettings

# The traces README's reference setting for the Mooncake trace: 16 engines with 1 M tokens of cache each.
TRACE_DEFAULT_CAPACITY_TOKENS = 1_000_000

SourceFactory = Callable[[], RequestSource]
RoutingFactory = Callable[[str], RoutingSettings]
ProgressFactory = Callable[[str, int], ProgressHook | None]


@dataclass(frozen=True, slots=True)
class Scenario:
    """What to simulate: a cluster, the requests (a fresh source per run) and the router's settings."""

    label: str
    spec: ClusterSpec
    make_source: SourceFactory
    routing: RoutingFactory
    rate_scale: float = 1.0
    pd: PdSpec | None = None  # prefill/decode roles (None: colocated)


def merged(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``top`` laid over it, nested mappings merged key by key."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        both = isinstance(below, Mapping) and isinstance(value, Mapping)
        out[key] = merged(below, value) if both else value  # type: ignore[arg-type]
    return out


def routing_factory(knobs: Mapping[str, Any] | None, capacity_tokens: int, **fixed: Any) -> RoutingFactory:
    """The router's settings per policy: the defaults, with the index's per-worker capacity = the engines'
    KV capacity, then ``knobs`` (the ``routing`` section of ``simulate --config/--set``, nested as in the
    YAML file), then ``fixed`` (what the requests impose, e.g. the trace's block size) and the policy."""
    base = merged({"index": {"worker_capacity_tokens": capacity_tokens}}, knobs or {})
    base = merged(base, fixed)
    return lambda policy: RoutingSettings.model_validate({**base, "policy": policy})


def trace_scenario(
    path: str | Path,
    spec: ClusterSpec,
    rate_scale: float = 1.0,
    limit: int | None = None,
    copies: int = 1,
    knobs: Mapping[str, Any] | None = None,
) -> Scenario:
    rows = tile(read_trace(path), copies)[:limit] if copies > 1 else read_trace(path, limit)
    block = {"keys": {"block_tokens": MOONCAKE_BLOCK_TOKENS}}
    routing = routing_factory(knobs, spec.capacity_tokens, **block)

    source = lambda: TraceSource(rows, spec.seed, rate_scale)  # noqa: E731
    label = Path(path).name + (f" x{copies} tiled" if copies > 1 else "")
    return Scenario(label, spec, source, routing, rate_scale)


def workload_scenario(
    name: str,
    spec: ClusterSpec,
    rate_scale: float = 1.0,
    limit: int | None = None,
    options: dict[str, Any] | None = None,
    sessions: bool = False,
    knobs: Mapping[str, Any] | None = None,
) -> Scenario:
    from prefix_router.lab.sim.workload_source import WorkloadSource, scale_arrivals
    from prefix_router.lab.workloads.registry import get_workload

    model = spec.profile.model
    built = get_workload(name, requests=limit, seed=spec.seed, model=model, **(options or {}))
    workload = scale_arrivals(built, rate_scale)
    limits = EngineLimits(model, spec.profile.block_size, spec.profile.max_model_len)

    routing = routing_factory(knobs, spec.capacity_tokens)
    source = lambda: WorkloadSource(workload, routing("prefix"), limits, sessions)  # noqa: E731
    return Scenario(name, spec, source, routing, rate_scale)


def simulate(
    scenario: Scenario,
    policies: Sequence[str],
    progress: ProgressFactory | None = None,
    decisions: DecisionLog | None = None,
) -> dict[str, Any]:
    """Run each policy, then the oracle; returns the JSON report (``"simulated": true``). ``decisions``:
    every policy's decisions written there (``decision_log.py``)."""
    summaries: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    arrivals = None
    for policy in policies:
        source = scenario.make_source()
        hook = progress(policy, source.total) if progress is not None else None
        sim = ClusterSimulation(
            scenario.spec, policy, source, scenario.routing(policy), hook, keep_arrivals=arrivals is None,
            decisions=decisions, pd=scenario.pd,
        )  # fmt: skip
        result = sim.run()
        arrivals = arrivals if arrivals is not None else result.arrivals
        summaries[policy] = summarize(result.stats)
        extra[policy] = details(result.stats, result.wall_s)
        if result.pd is not None:
            extra[policy]["pd"] = result.pd
    return _report(scenario, summaries, extra, _oracle(scenario, arrivals or []))


def _oracle(scenario: Scenario, arrivals: Sequence[Any]) -> dict[str, Any]:
    spec = scenario.spec
    block_tokens = scenario.make_source().engine_block_tokens
    pooled = spec.instances * spec.capacity_tokens
    result = oracle((a.engine for a in arrivals), pooled, block_tokens, spec.profile.block_size)
    return {
        "hit_rate": result.hit_rate,
        "ideal_hit_rate": result.ideal_hit_rate,
        "capacity_tokens": result.capacity_tokens,
    }


def _report(
    scenario: Scenario, summaries: dict[str, Any], extra: dict[str, Any], oracle_row: dict[str, Any]
) -> dict[str, Any]:
    spec = scenario.spec
    return {
        "simulated": True,
        "source": scenario.label,
        "instances": spec.instances,
        "profile": spec.profile.name,
        "capacity_tokens_per_instance": spec.capacity_tokens,
        "seed": spec.seed,
        "rate_scale": scenario.rate_scale,
        "policies": summaries,
        "oracle": oracle_row,
        "details": extra,
    }
