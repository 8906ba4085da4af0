"""The concurrency sweep, SIMULATED: every policy at 1 to 32 in flight on 2, 4 and 8 engines (issue 41).

The grid (``prefix_router.lab.sim.sweep``): fleets of 2, 4 and 8 engines; 1, 4, 8, 16 and 32 requests
in flight; closed loops and open (Poisson) arrivals at the rate the best emulated peer's closed loop
sustained; a CPU-like engine profile (SmolLM2-135M on a core, assumed) and a GPU-like one (Llama 3.1 8B
on an H100, derived from published figures: see ``sweep.py``); KV-bound and roomy caches; the
``chatbots`` workload with 4 tenants per engine. Every policy of the registry, the emulated peers
(``sglang_cache_aware``, ``dynamo_kv``) and the load-only ones included, replays the same requests per
seed; seeds are pooled (mean, 95 % t-interval over the seeds).

Printed and written (``--out``): per cell, every policy's hit rate and TTFT mean with their intervals,
TTFT p99 and imbalance, and which of issue 41's targets the judged policy (``--judge``, default: the
registry's default policy) meets; then the count of cells meeting each target and the geometric mean of
its TTFT mean over the best emulated peer's. ``--plot-prefix`` draws hit rate and TTFT mean against
concurrency, one PNG per arrival process.

    python benchmarks/concurrency_sweep.py --quick          # 12 settings, 2 seeds
    python benchmarks/concurrency_sweep.py                  # 60 settings, 3 seeds
    python benchmarks/concurrency_sweep.py --judge ttft --set policies.prefix.decoding_penalty_tokens=128
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prefix_router.lab.sim import sweep, sweep_report
from prefix_router.lab.sim.sweep import Plan, Setting
from prefix_router.routing import DEFAULT_POLICY, POLICY_NAMES
from prefix_router.settings import parse_scalar, set_dotted

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "concurrency" / "sweep.txt"
DEFAULT_PLOT = ROOT / "docs" / "img" / "concurrency_sweep"
MAX_WORKERS = 2  # the machine has 2 cores, shared


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="2 and 4 engines, 1/8/32 in flight, KV-bound, 2 seeds"
    )
    p.add_argument("--engines", type=int, nargs="+", default=None)
    p.add_argument("--concurrency", type=int, nargs="+", default=None)
    p.add_argument("--profiles", nargs="+", default=None, choices=sweep.PROFILES)
    p.add_argument("--caches", nargs="+", default=None, choices=sweep.CACHES)
    p.add_argument("--arrivals", nargs="+", default=list(sweep.ARRIVALS), choices=sweep.ARRIVALS)
    p.add_argument("--policies", default=",".join(POLICY_NAMES), help="comma-separated (default: all)")
    p.add_argument("--judge", default=DEFAULT_POLICY, help="the policy whose targets are checked")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--quick: 0 1)")
    p.add_argument("--requests", type=int, default=None, help="per run (default 300, --quick 200)")
    p.add_argument("--workers", type=int, default=MAX_WORKERS, help=f"processes (at most {MAX_WORKERS})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a routing knob")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="the results text file ('' for none)")
    p.add_argument("--json", dest="json_out", default="", help="also write the cells as JSON here")
    p.add_argument("--plot-prefix", default=str(DEFAULT_PLOT), help="PNG path prefix ('' for none)")
    p.add_argument("--from-json", default="", help="run nothing: text and plots from this --json output")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def knobs(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` routing knobs (keys as under ``routing:``), nested."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        set_dotted(out, key.removeprefix("routing."), parse_scalar(value))
    return out


def grid(args: argparse.Namespace) -> tuple[list[Setting], Plan]:
    base = sweep.quick_grid() if args.quick else {}
    chosen = sweep.settings(
        args.engines or base.get("engines", sweep.ENGINES),
        args.profiles or base.get("profiles", sweep.PROFILES),
        args.caches or base.get("caches", sweep.CACHES),
        args.concurrency or base.get("concurrency", sweep.CONCURRENCY),
    )
    policies = sweep.known_policies([p.strip() for p in args.policies.split(",") if p.strip()])
    if args.judge not in policies:
        raise ValueError(f"--judge {args.judge} is not among the policies")
    seeds = tuple(args.seeds or ((0, 1) if args.quick else (0, 1, 2)))
    requests = args.requests or (200 if args.quick else 300)
    return list(chosen), Plan(policies, seeds, requests, knobs(args.set), tuple(args.arrivals))


def run_all(
    settings: Sequence[Setting], plan: Plan, workers: int, progress: bool, partial: Path | None = None
) -> list[dict[str, Any]]:
    """Every setting's cells, in grid order, over a pool of at most ``MAX_WORKERS`` processes; the cells
    done so far are written to ``partial`` (JSON) after each setting, so a long run can be followed and an
    interrupted one rendered (``--from-json``)."""
    workers = max(1, min(workers, MAX_WORKERS, len(settings)))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    results: dict[int, list[dict[str, Any]]] = {}
    with Progress(*columns, console=Console(stderr=True), disable=not progress) as bars:
        task = bars.add_task("settings", total=len(settings))
        if workers == 1:
            for i, setting in enumerate(settings):
                results[i] = sweep.run_setting(setting, plan)
                _save(partial, results)
                bars.advance(task)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures: dict[Future[list[dict[str, Any]]], int] = {
                    pool.submit(sweep.run_setting, s, plan): i for i, s in enumerate(settings)
                }
                for future in as_completed(futures):
                    results[futures[future]] = future.result()
                    _save(partial, results)
                    bars.advance(task)
    return [cell for i in range(len(settings)) for cell in results[i]]


def _save(partial: Path | None, results: dict[int, list[dict[str, Any]]]) -> None:
    if partial is not None:
        cells = [cell for i in sorted(results) for cell in results[i]]
        partial.write_text(json.dumps({"simulated": True, "partial": True, "cells": cells}) + "\n")


def header(settings: Sequence[Setting], plan: Plan, judged: str) -> list[str]:
    lines = [
        "SIMULATED concurrency sweep (benchmarks/concurrency_sweep.py): chatbots, 4 tenants per engine,",
        f"{len(settings)} settings x {len(plan.arrivals)} arrivals, {plan.requests} requests per run, "
        f"seeds {list(plan.seeds)} pooled (mean [95 % t-interval over seeds]), "
        f"knobs {plan.knobs or 'defaults'}. * = the judged policy ({judged}).",
        f"Open arrivals: Poisson at {sweep.OPEN_LOAD:.0%} of the best emulated peer's closed-loop rate.",
    ]
    for key, shape in sweep.sweep_profiles().items():
        f = sweep.profile_figures(shape.engine)
        lines.append(
            f"profile {key}: {shape.engine.name}, prefill {f['prefill_tokens_s']:,.0f} tok/s, decode step "
            f"{f['decode_step_ms_b1']:.1f}/{f['decode_step_ms_b8']:.1f}/{f['decode_step_ms_b32']:.1f} ms at "
            f"batch 1/8/32, caches {dict(shape.capacity)} tokens per engine"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings, plan = grid(args)
    except (KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.from_json:
        document = json.loads(Path(args.from_json).read_text())
        if any(args.judge not in c["policies"] for c in document["cells"]):
            print(f"error: --judge {args.judge} did not run in {args.from_json}", file=sys.stderr)
            return 2
        document.setdefault("header", ["SIMULATED concurrency sweep (an interrupted run: the settings done)"])
        document["judged"] = args.judge  # the JSON's cells judged again, for this policy
        document["header"] = [
            re.sub(r"judged policy \([^)]*\)", f"judged policy ({args.judge})", line)
            for line in document["header"]
        ]
        document["summary"] = sweep.summary(document["cells"], args.judge)
        write(document, args, sorted({c["arrivals"] for c in document["cells"]}))
        return 0
    partial = Path(args.json_out) if args.json_out else None
    cells = run_all(settings, plan, args.workers, not args.no_progress, partial)
    document = {
        "simulated": True,
        "judged": args.judge,
        "header": header(settings, plan, args.judge),
        "cells": cells,
        "summary": sweep.summary(cells, args.judge),
    }
    write(document, args, plan.arrivals)
    return 0


def write(document: dict[str, Any], args: argparse.Namespace, arrivals: Sequence[str]) -> None:
    """Print the report; write it, the JSON and a plot per arrival process where asked."""
    report = sweep_report.text(document)
    print(report, end="")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(document, indent=1) + "\n")
    if args.plot_prefix:
        for kind in arrivals:
            sweep_report.plot(document, f"{args.plot_prefix}_{kind}.png", kind)


if __name__ == "__main__":
    raise SystemExit(main())
