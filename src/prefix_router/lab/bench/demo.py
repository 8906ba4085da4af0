"""``prefix-router demo``: start 4 engines and the router on loopback, compare the policies, shut down.

Simulated setting (``--engine sim``, the default), chosen to finish in under 2 minutes on a 2-core machine:
four ``engine-sim`` processes with the ``llama-3.1-8b-h100`` timing profile in real time and a KV cache of
20,480 tokens each, so that each engine holds at most 10 of the 32 tenants' 2,048-token system prompts
while the four together hold them all: memory pressure, where routing decides the hit rate
(``--engine-opt kv_capacity_tokens=N`` changes it). Workload ``mixed``:
300 requests, Poisson at 10 sessions/s, half single questions to 32 chatbot tenants (Zipf 0.6), half
ShareGPT conversations under those tenants' system prompts. ``--workload unique`` runs the negative
control (no shared prefixes) at the same size. Everything the engines report is simulated.

``--engine llama-cpp`` starts four real llama.cpp engines (SmolLM2-135M through llama-cpp-python, see
``prefix_router.lab.launch.llama_cpp``) with a RAM prompt cache of about four prompt states each,
and replays a smaller workload (48 requests, 6 tenants with 200-token system prompts, two in flight at a
time) that a CPU can serve in a few minutes; ``--workers URL...`` uses engines that are already running.

``--engine vllm`` starts two real vLLM engines (the CPU build, SmolLM2-135M with its own weights, see
``prefix_router.lab.launch.vllm``; ``make vllm`` installs it), one core each, with KV caches of 8,192
tokens (64 blocks of 128: room for about four of the workload's eight 1,500-token system prompts per
engine), and replays 40 requests, two in flight at a time. Start-up takes a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from rich.console import Console

from prefix_router.lab.bench.commands import (
    emit,
    exit_code,
    option_error,
    parse_key_values,
    plan_from,
    workload_from,
)
from prefix_router.lab.bench.harness import run_bench
from prefix_router.lab.bench.table import output_console
from prefix_router.lab.workloads.arrivals import Arrivals
from prefix_router.lab.workloads.settings import WorkloadOptionError
from prefix_router.settings import parse_scalar

SIM_ENGINE_OPTIONS: Mapping[str, Any] = {
    "profile": "llama-3.1-8b-h100",
    "kv_capacity_tokens": 20_480,
    "time_scale": 1.0,
}
_SIM_WORKLOADS: Mapping[str, Mapping[str, Any]] = {
    "mixed": {
        "tenants": 32,
        "system_tokens": 2048,
        "zipf_s": 0.6,
        "output_tokens": 16,
        "max_output_tokens": 32,
    },
    "chatbots": {"tenants": 32, "system_tokens": 2048, "zipf_s": 0.6, "output_tokens": 16},
    "unique": {"prompt_tokens": 2048, "output_tokens": 16},
}
_LLAMA_CHAT: Mapping[str, Any] = {"tenants": 6, "system_tokens": 200, "zipf_s": 0.0, "question_tokens": 8}
_LLAMA_WORKLOADS: Mapping[str, Mapping[str, Any]] = {
    "mixed": {
        **_LLAMA_CHAT,
        "output_tokens": 8,
        "max_output_tokens": 8,
        "max_user_tokens": 32,
        "max_turns": 3,
    },
    "chatbots": {**_LLAMA_CHAT, "output_tokens": 8},
    "unique": {"prompt_tokens": 220, "output_tokens": 8},
}


@dataclass(frozen=True, slots=True)
class DemoSetting:
    """Size and pace of a demo run for one kind of engine."""

    requests: int
    arrivals: Arrivals
    workloads: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    timeout_s: float = 120.0


SIM_SETTING = DemoSetting(requests=300, arrivals=Arrivals("poisson", rate=10.0), workloads=_SIM_WORKLOADS)
# real llama.cpp on CPU: two requests in flight at a time, small prompts, and a RAM prompt cache of about
# four prompt states per engine (memory pressure, as in docs/benchmarks.md (Real engines))
LLAMA_SETTING = DemoSetting(
    requests=48, arrivals=Arrivals("closed", concurrency=2), workloads=_LLAMA_WORKLOADS, timeout_s=300.0
)
LLAMA_CACHE_BYTES = 21_000_000
_VLLM_CHAT: Mapping[str, Any] = {"tenants": 8, "system_tokens": 1500, "zipf_s": 0.0, "question_tokens": 16}
_VLLM_WORKLOADS: Mapping[str, Mapping[str, Any]] = {
    "mixed": {
        **_VLLM_CHAT,
        "output_tokens": 8,
        "max_output_tokens": 16,
        "max_user_tokens": 64,
        "max_turns": 3,
    },
    "chatbots": {**_VLLM_CHAT, "output_tokens": 8},
    "unique": {"prompt_tokens": 1500, "output_tokens": 8},
}
# real vLLM on CPU: two instances pinned a core each, two requests in flight, caches under pressure
VLLM_SETTING = DemoSetting(
    requests=40, arrivals=Arrivals("closed", concurrency=2), workloads=_VLLM_WORKLOADS, timeout_s=300.0
)
VLLM_CACHE_TOKENS = 8192
DEFAULT_INSTANCES = {"sim": 4, "llama-cpp": 4, "vllm": 2}


class DemoError(RuntimeError):
    """The demo's engines could not be started (the message says why and what to do)."""


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """SIGTERM raises ``SystemExit`` (exit code 143) for the ``with`` body, so the blocks around the
    engines stop them on the way out instead of leaving them running; the previous handler comes back
    after."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def engines(args: argparse.Namespace) -> Iterator[tuple[list[str], bool | None]]:
    """The workers' URLs and whether they are simulated (None: detect), running for the ``with`` body."""
    if args.workers:
        yield list(args.workers), None
    elif args.engine == "sim":
        from prefix_router.lab.launch.engine_sim import start_engines

        with start_engines(instances(args), **sim_options(args)) as urls:
            yield urls, True
    elif args.engine == "vllm":
        with _vllm_fleet(instances(args)) as urls:
            yield urls, False
    else:
        with _llama_fleet(instances(args)) as urls:
            yield urls, False


def instances(args: argparse.Namespace) -> int:
    """``--engines``, else the engine kind's default."""
    return int(args.engines or DEFAULT_INSTANCES[args.engine])


def sim_options(args: argparse.Namespace) -> dict[str, Any]:
    """The demo's engine options, overridden by ``--engine-opt KEY=VALUE``."""
    given = {k: parse_scalar(v) for k, v in parse_key_values(getattr(args, "engine_opt", None)).items()}
    return {**SIM_ENGINE_OPTIONS, **given}


@contextlib.contextmanager
def _llama_fleet(instances: int) -> Iterator[list[str]]:
    try:
        from prefix_router.lab.launch.fleet import LaunchError
        from prefix_router.lab.launch.llama_cpp import LlamaCppFleet, LlamaCppSettings
    except ImportError as exc:  # pragma: no cover - the engines package is part of the project
        raise DemoError(f"the llama.cpp launcher is not available: {exc}") from None
    try:
        fleet = LlamaCppFleet(LlamaCppSettings(instances=instances, cache_bytes=LLAMA_CACHE_BYTES))
        fleet.start()
    except LaunchError as exc:
        raise DemoError(f"llama.cpp engines did not start: {exc}") from None
    try:
        yield fleet.urls
    finally:
        fleet.stop()


@contextlib.contextmanager
def _vllm_fleet(count: int) -> Iterator[list[str]]:
    from prefix_router.lab.launch.fleet import LaunchError
    from prefix_router.lab.launch.vllm import VllmFleet, VllmSettings

    try:
        fleet = VllmFleet(VllmSettings(instances=count, kv_cache_tokens=VLLM_CACHE_TOKENS, max_num_seqs=8))
        fleet.start()
    except LaunchError as exc:
        raise DemoError(f"vLLM engines did not start: {exc}") from None
    try:
        yield fleet.urls
    finally:
        fleet.stop()


def setting_for(args: argparse.Namespace) -> DemoSetting:
    if args.workers:
        return SIM_SETTING
    return {"llama-cpp": LLAMA_SETTING, "vllm": VLLM_SETTING}.get(args.engine, SIM_SETTING)


def demo_args(args: argparse.Namespace, setting: DemoSetting) -> argparse.Namespace:
    """The demo's defaults filled into the parsed arguments (explicit flags win)."""
    filled = argparse.Namespace(**vars(args))
    if filled.requests is None and filled.duration is None:
        filled.requests = setting.requests
    if filled.timeout == 600.0:
        filled.timeout = setting.timeout_s
    return filled


def run_demo(args: argparse.Namespace) -> int:
    setting = setting_for(args)
    args = demo_args(args, setting)
    console = output_console()
    defaults = setting.workloads.get(args.workload, {})
    try:
        workload = workload_from(args, defaults, setting.arrivals)
    except WorkloadOptionError as exc:
        return option_error("demo", exc)
    if any(s.session_id.startswith("synthetic-") for s in workload.sessions):
        console.print("[yellow]note:[/] ShareGPT trace not found (../shared/traces, $PREFIX_ROUTER_TRACES):"
                      " the conversations are synthetic")  # fmt: skip
    try:
        with sigterm_exits(), engines(args) as (urls, simulated):
            args.workers = urls
            plan = plan_from(args, workload)
            if simulated is not None:
                plan = dataclasses.replace(plan, simulated=simulated)
            outcome = asyncio.run(run_bench(plan))
    except DemoError as exc:
        console.print(f"[red]error:[/] {exc}", soft_wrap=True)  # one line, whatever the width
        return 2
    _banner(console, outcome.document)
    emit(outcome, args, console)
    for line in verdict(outcome.document):
        console.print(line)
    return exit_code(outcome.document)


def _banner(console: Console, document: Mapping[str, Any]) -> None:
    if document.get("simulated"):
        console.print("[bold yellow]SIMULATED ENGINES[/]: every number below comes from prefix-router's "
                      "engine simulator (llama-3.1-8b-h100 profile), not from real hardware.")  # fmt: skip
    else:
        console.print("[bold]real engines[/]: " + ", ".join(document.get("engines", [])))


def verdict(document: Mapping[str, Any]) -> list[str]:
    """One line comparing ``prefix`` with ``random`` (TTFT p50 and engine-reported hit rate)."""
    policies = document["policies"]
    prefix, base = policies.get("prefix"), policies.get("random")
    if not prefix or not base:
        return []
    p50, b50 = prefix["ttft_ms"]["p50"], base["ttft_ms"]["p50"]
    gain = _gain(b50, p50)
    return [
        f"prefix vs random: TTFT p50 {gain} ({p50} ms vs {b50} ms); engine-reported hit rate "
        f"{_pct(prefix['hit_rate'])} vs {_pct(base['hit_rate'])}"
    ]


def _gain(baseline: float | None, value: float | None) -> str:
    if not baseline or not value:
        return "n/a"
    return f"{baseline / value:.2f}x lower" if baseline >= value else f"{value / baseline:.2f}x higher"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"
