"""What ``prefix-router bench`` and ``prefix-router demo`` do with their parsed arguments."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from prefix_router.lab.bench import plots, table
from prefix_router.lab.bench.harness import BenchOutcome, BenchPlan, run_bench
from prefix_router.lab.sim.decision_log import DecisionLog
from prefix_router.lab.workloads.arrivals import Arrivals
from prefix_router.lab.workloads.registry import get_workload, workload_specs
from prefix_router.lab.workloads.settings import WorkloadOptionError
from prefix_router.lab.workloads.types import Workload
from prefix_router.settings import parse_scalar

MAX_DURATION_REQUESTS = 20_000  # requests generated for --duration runs (the run stops at the deadline)
MULTI_TURN_WORKLOADS = frozenset({"multi-turn", "mixed", "agents"})


def parse_key_values(items: list[str] | None) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}`` (values stay strings; the consumer coerces)."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def arrivals_from(args: argparse.Namespace) -> Arrivals | None:
    if args.rate is not None:
        return Arrivals("poisson", rate=args.rate)
    if args.concurrency is not None:
        return Arrivals("closed", concurrency=args.concurrency)
    if args.trace_time_scale is not None:
        return Arrivals("trace", time_scale=args.trace_time_scale)
    return None


def requests_for(args: argparse.Namespace, arrivals: Arrivals | None) -> int | None:
    """``--requests``, or enough for ``--duration`` (capped), or None (the workload's default)."""
    if args.requests is not None or args.duration is None:
        return None if args.requests is None else int(args.requests)
    chosen = arrivals or workload_specs()[args.workload].default_arrivals
    if chosen.kind != "poisson":
        return MAX_DURATION_REQUESTS
    turns = 8 if args.workload in MULTI_TURN_WORKLOADS else 1
    return min(MAX_DURATION_REQUESTS, math.ceil(chosen.rate * float(args.duration) * 1.5) * turns + 16)


def workload_from(
    args: argparse.Namespace, defaults: Mapping[str, Any] | None = None, arrivals: Arrivals | None = None
) -> Workload:
    """The workload the arguments name; ``defaults`` and ``arrivals`` are overridden by explicit flags."""
    chosen = arrivals_from(args) or arrivals
    options = {**(defaults or {}), **parse_key_values(args.workload_opt)}
    return get_workload(args.workload, requests=requests_for(args, chosen), seed=args.seed,
                        model=args.model or "", arrivals=chosen, **options)  # fmt: skip


def emit(outcome: BenchOutcome, args: argparse.Namespace, console: Console | None = None) -> str:
    """Print the table; write ``--json`` and ``--report`` outputs. Returns the table as text."""
    text = table.render(outcome.document, console)
    payload = json.dumps(outcome.document, indent=2) + "\n"
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(payload)
    if args.report:
        directory = Path(args.report)
        plots.write_all(outcome.document, outcome.ttfts(), directory)
        (directory / "results.json").write_text(payload)
        (directory / "table.txt").write_text(text)
    return text


def exit_code(document: Mapping[str, Any]) -> int:
    """1 when some policy had every request fail (the comparison means nothing), else 0."""
    failed = [n for n, s in document["policies"].items() if s["requests"] and s["errors"] == s["requests"]]
    return 1 if failed else 0


def plan_from(args: argparse.Namespace, workload: Workload) -> BenchPlan:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    router = getattr(args, "router", None)
    return BenchPlan(
        workers=tuple(args.workers),
        policies=(args.label,) if router else tuple(policies),
        workload=workload,
        model=args.model,
        router_url=router,
        routing={k: parse_scalar(v) for k, v in parse_key_values(getattr(args, "routing", None)).items()},
        simulated=getattr(args, "simulated", None),
        reset=not getattr(args, "no_reset", False),
        timeout_s=args.timeout,
        max_in_flight=args.max_in_flight,
        duration_s=args.duration,
        progress=not args.no_progress,
    )


def option_error(command: str, exc: WorkloadOptionError) -> int:
    """A bad ``--workload-opt``: its one line on stderr, exit code 2."""
    print(f"prefix-router {command}: {exc}", file=sys.stderr)
    return 2


def bench_command(args: argparse.Namespace) -> int:
    try:
        workload = workload_from(args)
    except WorkloadOptionError as exc:
        return option_error("bench", exc)
    plan = plan_from(args, workload)
    if getattr(args, "decisions", None):
        simulated = plan.simulated is not False
        with DecisionLog(args.decisions, simulated=simulated) as log:
            outcome = asyncio.run(run_bench(dataclasses.replace(plan, decisions=log)))
    else:
        outcome = asyncio.run(run_bench(plan))
    emit(outcome, args)
    if args.records:
        write_records(outcome, Path(args.records))
    return exit_code(outcome.document)


RECORD_FIELDS = ("session_id", "turn", "endpoint", "start_s", "ttft_s", "e2e_s", "ok", "error", "status",
                 "prompt_tokens", "cached_tokens", "output_tokens", "worker")  # fmt: skip


def write_records(outcome: BenchOutcome, path: Path) -> None:
    """One JSON object per request: the policy plus what the client measured (times in seconds)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for policy, result in outcome.results.items():
            for record in result.records:
                row = {"policy": policy, **{f: getattr(record, f) for f in RECORD_FIELDS}}
                out.write(json.dumps(row) + "\n")
