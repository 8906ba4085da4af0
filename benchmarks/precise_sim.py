"""Precise vs approximate vs random in the simulator (SIMULATED engines): eviction-heavy cells, engine
restarts and cache resets, 16-64 instances, side by side over the same requests, several seeds.

``precise``: the prefix policy on the engines' KV cache events (``lab/sim/precise_feed.py``: every
simulated cache publishes BlockStored / BlockRemoved / AllBlocksCleared, each message reaching the
router ``--event-lag-ms`` of simulated time after it was sent; a restarted engine announces nothing, the
router learns of it from the new process's first message); ``approximate``: the prefix policy on the
router's own model of the caches; ``approximate'``: approximate again with its router's random ties
drawn from another seed (an A/A test: the spread of a difference that is 0 in expectation, the
comparison's own noise); ``random``: the baseline. ``oracle``: one pooled cache of the same total size.
Per seed the modes run the same requests and the same faults: ``vs approximate`` is the
mean of the paired differences over the seeds (its spread: standard deviation, min and max), ``TTFT`` the
mean of the per-seed ratios to approximate's mean TTFT. ``misrouted``: requests predicted more than one
engine block above what the engine then reported (routed for a prefix the worker no longer held), summed
over the seeds; for precise, split into those sent to a faulted worker before the router's view of it
cleared (the fault's message had not arrived yet), after it cleared, and the rest (removals in transit).
Last, per seed, the paired differences of precise and of ``approximate'``, with the 95 % interval
of their mean.

    python benchmarks/precise_sim.py --requests 3000 --seeds 0,1,2,3,4 \
        --out benchmarks/results/precise_sim.txt
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prefix_router.lab.sim.events import Fault
from prefix_router.lab.sim.profiles import get_profile
from prefix_router.lab.sim.run import _oracle, workload_scenario
from prefix_router.lab.sim.simulator import ClusterSimulation, ClusterSpec, Record
from prefix_router.lab.sim.stats import summarize

# label, policy, precise, router reseeded (``approximate'``, the A/A test: see the header)
MODES = (
    ("random", "random", False, False),
    ("approximate", "prefix", False, False),
    ("approximate'", "prefix", False, True),
    ("precise", "prefix", True, False),
)
CELLS = (
    "chatbots:16:20000:none,chatbots:16:20000:restart,agents:16:40000:none,agents:16:40000:reset,"
    "mixed:32:20000:none,mixed:64:20000:restart"
)


def faults_for(kind: str, instances: int, span_s: float, seed: int) -> list[tuple[float, Fault]]:
    """Restarts or resets of a quarter of the instances, spread over the middle of the run."""
    if kind == "none":
        return []
    rng = random.Random(seed)
    chosen = rng.sample(range(instances), max(1, instances // 4))
    return [(span_s * (0.3 + 0.4 * i / len(chosen)), Fault(n, kind)) for i, n in enumerate(chosen)]


@dataclass(slots=True)
class Tally:
    """One mode's figures in one cell, over the seeds."""

    hits: list[float] = field(default_factory=list)  # paired differences to approximate
    hits_abs: list[float] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    misrouted: int = 0
    after_last: int = 0
    before_clear: int = 0
    after_clear: int = 0
    round_trips: list[float] = field(default_factory=list)


def misrouted(sim: ClusterSimulation, block: int) -> list[Record]:
    return [r for r in sim.records if r.predicted - r.cached > block]


def split_by_clear(
    sim: ClusterSimulation, plan: Sequence[tuple[float, Fault]], mis: list[Record], tally: Tally
) -> None:
    """Count ``mis`` sent to a faulted worker before and after the router's view of it cleared, and the
    round trip: from the first request sent there after the fault (else the fault) to the clear (a
    restarted engine's first message comes with the first blocks it stores)."""
    assert sim.feed is not None
    for at, fault in plan:
        cleared = sim.feed.cleared_at[fault.instance]
        cleared = cleared if cleared is not None and cleared >= at else None
        if cleared is not None:
            sent = [
                r.arrival for r in sim.records if r.instance == fault.instance and at < r.arrival <= cleared
            ]
            tally.round_trips.append(cleared - min(sent, default=at))
        mine = [r for r in mis if r.instance == fault.instance and r.arrival > at]
        late = [r for r in mine if cleared is not None and r.arrival > cleared]
        tally.after_clear += len(late)
        tally.before_clear += len(mine) - len(late)


def run_seed(
    workload: str,
    instances: int,
    capacity: int,
    faults: str,
    seed: int,
    args: argparse.Namespace,
    tallies: dict[str, Tally],
) -> float:
    """The three modes on one seed's requests and faults; returns the oracle's hit rate."""
    spec = ClusterSpec(instances, get_profile(args.profile), capacity, seed=seed)
    scenario = workload_scenario(workload, spec, args.rate_scale, args.requests)
    span = max((r.arrival for r in scenario.make_source().initial()), default=0.0)
    plan = faults_for(faults, instances, span, seed)
    last_fault = max((t for t, _ in plan), default=0.0)
    block = scenario.make_source().engine_block_tokens
    arrivals, results = None, {}
    for label, policy, precise, reseeded in MODES:
        sim = ClusterSimulation(
            spec,
            policy,
            scenario.make_source(),
            scenario.routing(policy),
            keep_arrivals=arrivals is None,
            precise=precise,
            faults=plan,
            event_lag_s=args.event_lag_ms / 1000,
            router_seed=f"router:{seed}:reseeded" if reseeded else None,
        )
        result = sim.run()
        arrivals = arrivals if arrivals is not None else result.arrivals
        summary = summarize(result.stats)
        results[label] = summary["hit_rate"], summary["ttft_ms"]["mean"]
        mis, tally = misrouted(sim, block), tallies[label]
        tally.misrouted += len(mis)
        tally.after_last += len([r for r in mis if r.arrival > last_fault]) if plan else 0
        if precise:
            split_by_clear(sim, plan, mis, tally)
    oracle = _oracle(scenario, arrivals or [])["hit_rate"]
    approx_hit, approx_ttft = results["approximate"]
    for label, (hit, ttft) in results.items():
        tallies[label].hits.append(hit - approx_hit)
        tallies[label].hits_abs.append(hit)
        tallies[label].shares.append(hit / oracle if oracle else 0.0)
        tallies[label].ttft.append(ttft / approx_ttft if approx_ttft else 0.0)
    return oracle


def cell(workload: str, instances: int, capacity: int, faults: str, args: argparse.Namespace) -> list[str]:
    tallies = {label: Tally() for label, *_ in MODES}
    oracles = [run_seed(workload, instances, capacity, faults, s, args, tallies) for s in args.seeds]
    head = f"{workload:9s} {instances:3d} x {capacity // 1000:5d}k tokens  faults {faults:7s}"
    lines = [f"{head}  oracle {statistics.mean(oracles):.1%} (mean over {len(oracles)} seeds)"]
    for label, tally in tallies.items():
        d = [x * 100 for x in tally.hits]
        lines.append(
            f"    {label:12s} hit {statistics.mean(tally.hits_abs):6.1%}  "
            f"{statistics.mean(tally.shares):6.1%} of oracle (min {min(tally.shares):6.1%})  "
            f"vs approximate {statistics.mean(d):+7.3f} pt (sd {statistics.pstdev(d):5.3f}, "
            f"{min(d):+7.3f} to {max(d):+7.3f})  TTFT x{statistics.mean(tally.ttft):5.3f}  "
            f"misrouted {tally.misrouted:5d}  after the last fault {tally.after_last:4d}"
        )
    precise = tallies["precise"]
    if faults != "none":
        trip = f"{max(precise.round_trips) * 1000:.0f} ms" if precise.round_trips else "none cleared"
        lines.append(
            f"    precise on faulted workers: misrouted before the view cleared {precise.before_clear}, "
            f"after {precise.after_clear}; round trip to the clear at most {trip}"
        )
    for label in ("precise", "approximate'"):
        d = [x * 100 for x in tallies[label].hits]
        lines.append(
            f"    paired {label} - approximate per seed (pt): "
            + " ".join(f"{x:+.3f}" for x in d)
            + f"  (95% interval of the mean {interval(d)})"
        )
    return lines


def interval(d: Sequence[float]) -> str:
    """The mean of ``d`` plus and minus 1.96 standard errors (normal approximation), in points."""
    if len(d) < 2:
        return "n/a: one seed"
    half = 1.96 * statistics.stdev(d) / len(d) ** 0.5
    mean = statistics.mean(d)
    return f"{mean - half:+.3f} to {mean + half:+.3f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--profile", default="llama-3.1-8b-h100")
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--event-lag-ms", type=float, default=5.0, help="engine publish to router apply")
    p.add_argument("--cells", default=CELLS)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    seeds = ",".join(map(str, args.seeds))
    lines = [
        f"SIMULATED engines ({args.profile}), {args.requests} requests per run, seeds {seeds}, "
        f"KV event lag {args.event_lag_ms:g} ms"
    ]
    for spec in args.cells.split(","):
        workload, instances, capacity, faults = spec.split(":")
        block = cell(workload, int(instances), int(capacity), faults, args)
        lines += block
        print("\n".join(block), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
