"""Subcommands ``bench``, ``demo``, ``bench-index`` and ``bench-overhead`` (see ``prefix_router.cli``)."""

from __future__ import annotations

import argparse

# imported here, not in register: without the lab's libraries this module fails to import, and the
# top-level command lists its subcommands with the install line instead (prefix_router.cli)
from prefix_router.lab.bench.fidelity.cli import register as register_fidelity
from prefix_router.lab.bench.overhead import register as register_overhead
from prefix_router.lab.workloads.registry import workload_names

DEFAULT_POLICIES = "random,round_robin,least_load,prefix"


def add_workload_args(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--workload", default=default, choices=workload_names(), help="request shape")
    parser.add_argument("--workload-opt", action="append", metavar="KEY=VALUE",
                        help="workload option, repeatable (e.g. tenants=32, block_tokens=16)")  # fmt: skip
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--requests", type=int, help="requests (turns) to send; default: the workload's")
    size.add_argument("--duration", type=float, metavar="S", help="stop starting requests after S seconds")
    arrival = parser.add_mutually_exclusive_group()
    arrival.add_argument("--rate", type=float, metavar="R", help="open loop: Poisson, R sessions/s")
    arrival.add_argument("--concurrency", type=int, metavar="C", help="closed loop: C sessions in flight")
    arrival.add_argument("--trace-time-scale", type=float, metavar="X",
                         help="open loop at the trace's timestamps times X (mooncake, trace)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help="model name to request (default: the first one the workers list)")


def add_output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="OUT", help="write the results (shared JSON schema) to OUT")
    parser.add_argument("--report", metavar="DIR", help="write results.json, table.txt and PNG plots to DIR")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    parser.add_argument(
        "--max-in-flight", type=int, default=256, help="open loop: sessions in flight at most"
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_bench(sub)
    _register_demo(sub)
    _register_index(sub)
    register_overhead(sub)
    register_fidelity(sub)


def _register_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="compare routing policies (or routers) on the same workers and workload")
    p.add_argument("--workers", nargs="+", required=True, metavar="URL", help="engine base URLs")
    p.add_argument(
        "--policies", default=DEFAULT_POLICIES, help="comma-separated policies (in-process router)"
    )
    p.add_argument(
        "--router", metavar="URL", help="benchmark this running router instead (any OpenAI-compatible)"
    )
    p.add_argument("--label", default="external", help="name of the --router row")
    p.add_argument(
        "--routing",
        action="append",
        metavar="KEY=VALUE",
        help="knob of the in-process router, keyed as under routing: (policies.prefix.load_factor=1.5)",
    )
    p.add_argument(
        "--no-reset", action="store_true", help="do not flush the engines' prefix caches per policy"
    )
    sim = p.add_mutually_exclusive_group()
    sim.add_argument(
        "--simulated", dest="simulated", action="store_true", default=None, help="label as simulated"
    )
    sim.add_argument("--real", dest="simulated", action="store_false", help="label as real engines")
    add_workload_args(p, "mixed")
    add_output_args(p)
    p.add_argument("--records", metavar="OUT", help="write one JSON line per request (per policy) to OUT")
    p.add_argument(
        "--decisions", metavar="OUT", help="write the router's decisions to OUT (for dashboard --replay)"
    )
    p.set_defaults(func=_run_bench)


def _register_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo", help="4 engines + the router on loopback, all policies compared, in ~2 minutes"
    )
    p.add_argument("--engine", choices=("sim", "llama-cpp", "vllm"), default="sim", help="engines to start")
    p.add_argument("--workers", nargs="+", metavar="URL", help="use these running engines instead")
    p.add_argument("--engines", type=int, default=None, help="engines to start (default 4; vllm: 2)")
    engine_help = "simulated engine option (repeatable): profile, kv_capacity_tokens, time_scale"
    p.add_argument("--engine-opt", action="append", metavar="KEY=VALUE", help=engine_help)
    p.add_argument("--policies", default=DEFAULT_POLICIES)
    add_workload_args(p, "mixed")
    add_output_args(p)
    p.set_defaults(func=_run_demo)


def _register_index(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench-index", help="prefix-index micro-benchmark: memory per block, decision time")
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--blocks", type=int, default=1_000_000, help="indexed blocks in all")
    p.add_argument("--prompt-chars", type=int, nargs="+", default=[16_000, 128_000])
    p.add_argument("--repeats", type=int, default=200, help="timed decisions per prompt length")
    p.add_argument("--cap-workers", type=int, default=256, help="workers of the global-cap case")
    p.add_argument("--cap-blocks", type=int, default=100_000, help="max_total_blocks of the global-cap case")
    p.add_argument("--json", metavar="OUT")
    p.set_defaults(func=_run_index)


def _run_bench(args: argparse.Namespace) -> int:
    from prefix_router.lab.bench.commands import bench_command

    return bench_command(args)


def _run_demo(args: argparse.Namespace) -> int:
    from prefix_router.lab.bench.demo import run_demo

    return run_demo(args)


def _run_index(args: argparse.Namespace) -> int:
    from prefix_router.lab.bench.index_bench import index_command

    return index_command(args)
