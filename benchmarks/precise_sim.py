"""Precise vs approximate vs random in the simulator (SIMULATED engines): eviction-heavy cells, engine
restarts and cache resets, 16-64 instances, side by side in one run over the same requests.

``precise``: the prefix policy on the engines' KV cache events (``lab/sim/precise_feed.py``: every
simulated cache publishes BlockStored / BlockRemoved / AllBlocksCleared, decoded values applied to the
router's event-fed views); ``approximate``: the prefix policy on the router's own model of the caches;
``random``: the baseline. ``oracle``: one pooled cache of the same total size. ``misrouted``: requests
predicted more than one engine block above what the engine then reported (routed for a prefix the
worker no longer held), counted over the whole run and after the last fault.

    python benchmarks/precise_sim.py --requests 4000 --out benchmarks/results/precise_sim.txt
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from prefix_router.lab.sim.events import Fault
from prefix_router.lab.sim.profiles import get_profile
from prefix_router.lab.sim.run import _oracle, workload_scenario
from prefix_router.lab.sim.simulator import ClusterSimulation, ClusterSpec
from prefix_router.lab.sim.stats import summarize

MODES = (("random", "random", False), ("approximate", "prefix", False), ("precise", "prefix", True))


def faults_for(kind: str, instances: int, span_s: float, seed: int) -> list[tuple[float, Fault]]:
    """Restarts or resets of a quarter of the instances, spread over the middle of the run."""
    if kind == "none":
        return []
    rng = random.Random(seed)
    chosen = rng.sample(range(instances), max(1, instances // 4))
    return [(span_s * (0.3 + 0.4 * i / len(chosen)), Fault(n, kind)) for i, n in enumerate(chosen)]


def cell(workload: str, instances: int, capacity: int, faults: str, args: argparse.Namespace) -> list[str]:
    spec = ClusterSpec(instances, get_profile(args.profile), capacity, seed=args.seed)
    scenario = workload_scenario(workload, spec, args.rate_scale, args.requests)
    source = scenario.make_source()
    span = max((r.arrival for r in source.initial()), default=0.0)
    plan = faults_for(faults, instances, span, args.seed)
    last_fault = max((t for t, _ in plan), default=0.0)
    rows, arrivals = [], None
    block = scenario.make_source().engine_block_tokens
    for label, policy, precise in MODES:
        sim = ClusterSimulation(
            spec,
            policy,
            scenario.make_source(),
            scenario.routing(policy),
            keep_arrivals=arrivals is None,
            precise=precise,
            faults=plan,
        )
        result = sim.run()
        arrivals = arrivals if arrivals is not None else result.arrivals
        summary = summarize(result.stats)
        mis = [a for a, predicted, cached in sim.records if predicted - cached > block]
        after = [a for a in mis if a > last_fault] if plan else []
        rows.append((label, summary["hit_rate"], summary["ttft_ms"]["mean"], len(mis), len(after)))
    oracle = _oracle(scenario, arrivals or [])["hit_rate"]
    head = f"{workload:9s} {instances:3d} x {capacity // 1000:5d}k tokens  faults {faults:7s}"
    lines = [f"{head}  oracle {oracle:.1%}"]
    approx = rows[1][1]
    for label, hit, ttft, mis_n, after_n in rows:
        share = hit / oracle if oracle else 0.0
        lines.append(
            f"    {label:11s} hit {hit:6.1%}  {share:6.1%} of oracle  vs approximate {hit - approx:+7.2%}  "
            f"TTFT mean {ttft:8.1f} ms  misrouted {mis_n:5d}  after the last fault {after_n:4d}"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--profile", default="llama-3.1-8b-h100")
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cells",
        default="chatbots:16:20000:none,chatbots:16:20000:restart,agents:16:40000:none,agents:16:40000:reset,"
        "mixed:32:20000:none,mixed:64:20000:restart",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    lines = [f"SIMULATED engines ({args.profile}), {args.requests} requests per run, seed {args.seed}"]
    for spec in args.cells.split(","):
        workload, instances, capacity, faults = spec.split(":")
        lines += cell(workload, int(instances), int(capacity), faults, args)
        print("\n".join(lines[-4:]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
