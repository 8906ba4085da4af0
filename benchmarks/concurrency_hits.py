"""Hit rate at concurrency, SIMULATED: the real-vLLM comparison's shape in the cluster simulator.

Two engines of 4,096 KV tokens with 128-token blocks (vLLM's CPU backend), the ``chatbots`` workload of
``benchmarks/epp.py --engines vllm`` (8 tenants, uniform popularity, short questions and replies) with
system prompts of ``--system-tokens`` workload units (900: about 930 prompt tokens in the simulator's
tokenizer, the size the real engines reported for the real run's 1,200 units of SmolLM2 text), closed
loops at each ``--concurrency``, every policy on the same requests, seeds pooled. The engines' timing is
a rough stand-in for SmolLM2-135M on one CPU core (about 1,000 prompt tokens a second, 30 ms decode
steps): an assumption, not a measurement, so that prefills overlap as they do on the real engines.

Printed per concurrency and policy: the mean hit rate over the seeds (engine-reported cached / prompt
tokens), TTFT mean, the load imbalance and the decisions per branch (summed over the seeds).

    python benchmarks/concurrency_hits.py
    python benchmarks/concurrency_hits.py --requests 600 --seeds 0 1 2 3 --concurrency 4 8 16
    python benchmarks/concurrency_hits.py --set policies.prefix.decoding_penalty_tokens=128
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from prefix_router.lab.sim.openai_api import EngineLimits
from prefix_router.lab.sim.run import routing_factory
from prefix_router.lab.sim.simulator import ClusterSimulation, ClusterSpec
from prefix_router.lab.sim.stats import summarize
from prefix_router.lab.sim.sweep import cpu_engine  # the timing assumed above
from prefix_router.lab.sim.workload_source import WorkloadSource
from prefix_router.lab.workloads.arrivals import Arrivals
from prefix_router.lab.workloads.registry import get_workload
from prefix_router.settings import parse_scalar, set_dotted

CAPACITY_TOKENS = 4096


def run(policy: str, concurrency: int, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    profile = cpu_engine()
    workload = get_workload(
        "chatbots", requests=args.requests, seed=seed, model=profile.model,
        arrivals=Arrivals("closed", concurrency=concurrency), tenants=8, system_tokens=args.system_tokens,
        zipf_s=0, question_tokens=16, output_tokens=8,
    )  # fmt: skip
    routing = routing_factory(knobs(args.set), CAPACITY_TOKENS)
    limits = EngineLimits(profile.model, profile.block_size, profile.max_model_len)
    source = WorkloadSource(workload, routing("prefix"), limits)
    spec = ClusterSpec(2, profile, CAPACITY_TOKENS, seed)
    result = ClusterSimulation(spec, policy, source, routing(policy)).run()
    return {**summarize(result.stats), "branches": result.stats.branches}


def knobs(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` routing knobs (keys as under ``routing:``), nested."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        set_dotted(out, key.removeprefix("routing."), parse_scalar(value))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--policies", default="prefix,ttft,sglang_cache_aware,dynamo_kv,least_load,random")
    p.add_argument("--system-tokens", type=int, default=900)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a routing knob")
    args = p.parse_args()
    print(f"SIMULATED: 2 engines x {CAPACITY_TOKENS} tokens, chatbots 8 tenants, {args.requests} requests, "
          f"seeds {args.seeds}, knobs {args.set or 'defaults'}")  # fmt: skip
    for concurrency in args.concurrency:
        for policy in args.policies.split(","):
            rows = [run(policy, concurrency, seed, args) for seed in args.seeds]
            hit = sum(r["hit_rate"] for r in rows) / len(rows)
            ttft = sum(r["ttft_ms"]["mean"] for r in rows) / len(rows)
            imbalance = sum(r["load_imbalance"] for r in rows) / len(rows)
            branches = dict(sorted(sum((Counter(r["branches"]) for r in rows), Counter()).items()))
            print(
                f"concurrency {concurrency:2d}  {policy:18s}  hit {hit * 100:5.1f} %  "
                f"TTFT mean {ttft:6.0f} ms  imbalance {imbalance:.2f}  branches {branches}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
