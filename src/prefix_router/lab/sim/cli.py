"""Subcommands ``engine-sim`` (a simulated OpenAI-compatible engine) and ``simulate`` (the cluster
simulator). Registered by ``prefix_router.cli``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prefix_router.lab.sim.decision_log import DecisionLog
from prefix_router.lab.sim.pd_sim import PdSpec
from prefix_router.lab.sim.profiles import DEFAULT_PROFILE, builtin_profiles, get_profile
from prefix_router.lab.sim.report import plot, print_report
from prefix_router.lab.sim.run import (
    TRACE_DEFAULT_CAPACITY_TOKENS,
    ProgressFactory,
    Scenario,
    simulate,
    trace_scenario,
    workload_scenario,
)
from prefix_router.lab.sim.simulator import ClusterSpec, ProgressHook
from prefix_router.routing import POLICY_NAMES

DEFAULT_POLICIES = "random,round_robin,least_load,consistent_hash,prefix"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    engine = sub.add_parser("engine-sim", help="run a simulated OpenAI-compatible engine (vLLM-like)")
    add_engine_sim_arguments(engine)
    engine.set_defaults(func=run_engine_sim)
    sim = sub.add_parser("simulate", help="replay a trace or workload on a simulated cluster, per policy")
    add_simulate_arguments(sim)
    sim.set_defaults(func=run_simulate)


# ---------------------------------------------------------------------- engine-sim


def add_engine_sim_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, required=True, help="TCP port (0: any free port, printed)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", default=None, help="served model name (default: the profile's model)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(builtin_profiles()))
    p.add_argument("--kv-capacity-tokens", type=int, default=None, help="KV cache size (default: profile)")
    p.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per model second")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help="publish KV cache events over ZMQ, as vLLM's option of that name: "
        '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "replay_endpoint": ..., "topic": ...}',
    )
    p.add_argument(
        "--role",
        choices=("prefill", "decode", "both"),
        default="both",
        help="prefill/decode disaggregation: the side it plays (default both: colocated)",
    )
    p.add_argument(
        "--kv-store",
        default=None,
        metavar="DIR",
        help="the folder engines started together share for KV handoffs (shared storage, SGLang rooms)",
    )
    p.add_argument(
        "--kv-events-layout",
        choices=("tagged", "positional"),
        default="tagged",
        help="events as tagged maps (vLLM >= 0.26, default) or positional arrays (older vLLM, SGLang)",
    )


def engine_sim_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prefix-router engine-sim", description="simulated engine")
    add_engine_sim_arguments(p)
    return p


def run_engine_sim(args: argparse.Namespace) -> int:
    from prefix_router.lab.sim.server import EngineSimSettings, serve_forever

    if args.time_scale <= 0:
        print("--time-scale must be positive", file=sys.stderr)
        return 2
    try:
        events = _kv_events(args.kv_events_config, args.kv_events_layout)
    except ValueError as exc:
        print(f"--kv-events-config: {exc}", file=sys.stderr)
        return 2
    cfg = EngineSimSettings(
        host=args.host,
        port=args.port,
        model=args.model,
        profile=args.profile,
        kv_capacity_tokens=args.kv_capacity_tokens,
        time_scale=args.time_scale,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_events=events,
        role=args.role,
        kv_store=args.kv_store,
    )
    asyncio.run(serve_forever(cfg))
    return 0


def _kv_events(text: str | None, layout: str) -> Any:
    from prefix_router.lab.sim.kv_publisher import KvEventsConfig

    return None if text is None else KvEventsConfig.from_json(text, tagged=layout == "tagged")


# ---------------------------------------------------------------------- simulate


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--trace", help="Mooncake-format JSONL trace (or a --record file)")
    what.add_argument("--workload", help="a benchmark workload name (see `prefix-router bench --help`)")
    p.add_argument("--instances", type=int, required=True)
    p.add_argument("--policies", default=DEFAULT_POLICIES, help=f"default {DEFAULT_POLICIES}")
    p.add_argument("--kv-capacity-tokens", type=int, default=None, help="per instance (see docs)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(builtin_profiles()))
    p.add_argument("--rate-scale", type=float, default=1.0, help="arrival-rate multiplier (2: twice as fast)")
    p.add_argument("--json", dest="json_out", default=None, help="write the JSON report here")
    p.add_argument("--plot", default=None, help="write a PNG here")
    p.add_argument(
        "--decisions",
        default=None,
        help="write every decision here (JSON lines) for `prefix-router dashboard --replay`",
    )
    p.add_argument("--limit", type=int, default=None, help="replay at most this many requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tile", type=int, default=1, help="replay K disjoint copies of the trace at once (scale tests)"
    )
    p.add_argument(
        "--scrape-interval",
        type=float,
        default=2.0,
        help="engine-load scrape period, s (0: off; proxy default 2)",
    )
    p.add_argument("--workload-opt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--config", metavar="FILE", help="a `serve` YAML config: its routing section sets the router's knobs"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a routing knob, with serve's keys: routing.load_factor=1.5 (after --config)",
    )
    p.add_argument(
        "--sessions",
        action="store_true",
        help="pass session ids to the router (its session affinity then overrides every policy)",
    )
    p.add_argument(
        "--prefill",
        type=int,
        default=0,
        metavar="N",
        help="P/D disaggregation: the first N instances prefill, the others decode (default 0: colocated)",
    )
    p.add_argument(
        "--skip-prefill-tokens",
        type=int,
        default=None,
        metavar="T",
        help="the decider's threshold (disaggregation.skip_prefill_tokens; default the router's)",
    )
    p.add_argument("--no-progress", action="store_true")


def run_simulate(args: argparse.Namespace) -> int:
    console = Console() if sys.stdout.isatty() else Console(width=180)
    try:
        policies = _policies(args.policies)
        scenario = _scenario(args)
    except (KeyError, ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)  # one line, whatever the width
        return 2
    with progress_bars(not args.no_progress) as progress, decision_log(args.decisions) as decisions:
        report = simulate(scenario, policies, progress, decisions)
    print_report(report, console)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        plot(report, args.plot)
    return 0


@contextmanager
def decision_log(path: str | None) -> Iterator[DecisionLog | None]:
    if path is None:
        yield None
        return
    with DecisionLog(path, simulated=True) as log:
        yield log


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICY_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICY_NAMES)}")
    return names


def _scenario(args: argparse.Namespace) -> Scenario:
    if args.instances < 1:
        raise ValueError("--instances must be >= 1")
    profile = get_profile(args.profile)
    default_capacity = TRACE_DEFAULT_CAPACITY_TOKENS if args.trace else profile.kv_capacity_tokens
    capacity = args.kv_capacity_tokens or default_capacity
    spec = ClusterSpec(args.instances, profile, capacity, args.seed, args.scrape_interval)
    knobs = routing_knobs(args.config, args.set)
    if args.trace:
        scenario = trace_scenario(args.trace, spec, args.rate_scale, args.limit, args.tile, knobs)
    else:
        options = _options(args.workload_opt)
        scenario = workload_scenario(
            args.workload, spec, args.rate_scale, args.limit, options, args.sessions, knobs
        )
    return dataclasses.replace(scenario, pd=_pd(args))


def _pd(args: argparse.Namespace) -> PdSpec | None:
    if not args.prefill:
        if args.skip_prefill_tokens is not None:
            raise ValueError("--skip-prefill-tokens needs --prefill")
        return None
    if not 0 < args.prefill < args.instances:
        raise ValueError(f"--prefill must leave a decode instance: 1..{args.instances - 1}")
    knobs = {} if args.skip_prefill_tokens is None else {"skip_prefill_tokens": args.skip_prefill_tokens}
    return PdSpec.split(args.prefill, args.instances - args.prefill, **knobs)


def routing_knobs(path: str | None, pairs: list[str]) -> dict[str, Any]:
    """The ``routing`` section given by ``--config FILE`` and ``--set routing.KEY=VALUE`` (dotted keys as
    ``serve --set``: ``routing.policies.prefix.load_factor=1.5``), validated exactly as ``serve`` validates
    it; nested as in the YAML file, only the keys given (the policy comes from --policies)."""
    from prefix_router.node import validate
    from prefix_router.settings import parse_scalar, read_yaml, set_dotted

    section = read_yaml(path).get("routing") if path else None
    if section is not None and not isinstance(section, dict):
        raise ValueError(f"config file {path}: routing must be a mapping")
    data: dict[str, Any] = {"routing": dict(section or {})}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key.startswith("routing.") or key == "routing.":
            raise ValueError(
                f"--set {pair!r}: expected routing.KEY=VALUE (simulate takes routing knobs only)"
            )
        set_dotted(data, key, parse_scalar(value))
    knobs: dict[str, Any] = data["routing"]
    knobs.pop("policy", None)
    validate({"routing": knobs})
    return knobs


def _options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--workload-opt needs KEY=VALUE, got {pair!r}")
        out[key.strip()] = value
    return out


@contextmanager
def progress_bars(enabled: bool) -> Iterator[ProgressFactory | None]:
    if not enabled:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), refresh_per_second=4) as bars:

        def factory(policy: str, total: int) -> ProgressHook:
            task = bars.add_task(f"simulating {policy}", total=total)
            return lambda n: bars.advance(task, n)

        yield factory
