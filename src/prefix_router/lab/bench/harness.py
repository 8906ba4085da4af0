"""``prefix-router bench``'s core: the same workload replayed once per policy against the same workers.

Per policy: fair warm reset of every worker (see ``workers``), scrape their counters, start the router
(in-process prefix-router with that policy, or the external ``router_url``), replay the workload with the
client runner, scrape again, summarise. The document follows the shared JSON schema (``summary``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from prefix_router.lab.bench import routers, workers
from prefix_router.lab.bench.runner import RunnerSettings, RunResult, run_workload
from prefix_router.lab.bench.summary import imbalance, report_document, summarize
from prefix_router.lab.sim.decision_log import DecisionLog
from prefix_router.lab.workloads.types import Session, Turn, Workload

RouterFactory = Callable[[str], contextlib.AbstractAsyncContextManager[str]]


@dataclass(frozen=True, slots=True)
class BenchPlan:
    workers: tuple[str, ...]
    policies: tuple[str, ...]
    workload: Workload
    model: str | None = None  # None: the first model the first worker lists
    router_url: str | None = None
    routing: Mapping[str, Any] = field(default_factory=dict)
    simulated: bool | None = None  # None: detected from the workers
    reset: bool = True
    settle_s: float = 0.2  # pause after a reset, before the policy's run
    timeout_s: float = 600.0
    max_in_flight: int = 256
    duration_s: float | None = None
    progress: bool = True
    decisions: DecisionLog | None = None  # the in-process router's decisions copied there
    warmup_requests: int = 4  # per worker, sent directly before the first policy (then caches are reset)


@dataclass(slots=True)
class BenchOutcome:
    document: dict[str, Any]
    results: dict[str, RunResult]

    def ttfts(self) -> dict[str, list[float]]:
        return {
            name: [r.ttft_s for r in res.records if r.ok and r.ttft_s is not None]
            for name, res in self.results.items()
        }


def router_factory(plan: BenchPlan) -> RouterFactory:
    if plan.router_url is not None:
        url = plan.router_url
        return lambda policy: routers.external(url)
    routers.preload()
    return lambda policy: routers.in_process(plan.workers, policy, plan.routing, plan.decisions)


async def run_bench(
    plan: BenchPlan, console: Console | None = None, factory: RouterFactory | None = None
) -> BenchOutcome:
    """Run every policy of ``plan`` in turn; returns the JSON document and the raw results."""
    out = console or Console(stderr=True)
    infos = await workers.describe_all(plan.workers)
    model = plan.model or next((i.model for i in infos if i.model), None) or "default"
    plan = dataclasses.replace(plan, model=model)
    make_router = factory or router_factory(plan)
    await warm_up(plan)
    summaries: dict[str, dict[str, Any]] = {}
    results: dict[str, RunResult] = {}
    notes: list[str] = []
    for policy in plan.policies:
        results[policy], summaries[policy] = await _one_policy(plan, policy, infos, make_router, notes, out)
    return BenchOutcome(_document(plan, infos, summaries, notes), results)


def _document(
    plan: BenchPlan,
    infos: Sequence[workers.WorkerInfo],
    summaries: dict[str, dict[str, Any]],
    notes: list[str],
) -> dict[str, Any]:
    detected = bool(infos) and all(i.simulated for i in infos)
    simulated = plan.simulated if plan.simulated is not None else detected
    extra = {
        "model": plan.model,
        "requests_planned": plan.workload.request_count,
        "notes": notes,
        "engines": sorted({i.engine for i in infos}),
        "router": plan.router_url or "prefix-router (in-process)",
    }
    return report_document(summaries, simulated=simulated, workload=plan.workload.name, workers=plan.workers,
                           extra=extra)  # fmt: skip


async def warm_up(plan: BenchPlan) -> None:
    """Tiny unique requests straight to every worker, so the first policy does not pay start-up costs."""
    if plan.warmup_requests <= 0:
        return
    turn = Turn(max_tokens=4, prompt="")
    for url in plan.workers:
        sessions = tuple(
            Session(
                f"warmup-{i}", 0.0, (dataclasses.replace(turn, prompt=f"warm-up {i} {url}"),), "completions"
            )
            for i in range(plan.warmup_requests)
        )
        cfg = RunnerSettings(
            base_url=url, model=plan.model or "default", timeout_s=plan.timeout_s, progress=False
        )
        await run_workload(Workload("warm-up", sessions), cfg)


async def _one_policy(
    plan: BenchPlan,
    policy: str,
    infos: Sequence[workers.WorkerInfo],
    make_router: RouterFactory,
    notes: list[str],
    out: Console,
) -> tuple[RunResult, dict[str, Any]]:
    if plan.reset:
        await _reset(infos, notes, out)
        await asyncio.sleep(plan.settle_s)
    before = await workers.counters_all(infos)
    async with make_router(policy) as url:
        result = await run_workload(plan.workload, _runner_config(plan, url, policy))
    after = await workers.counters_all(infos)
    return result, _summary(result, infos, before, after)


def _runner_config(plan: BenchPlan, url: str, policy: str) -> RunnerSettings:
    return RunnerSettings(base_url=url, model=plan.model or "default", timeout_s=plan.timeout_s,
                        max_in_flight=plan.max_in_flight, duration_s=plan.duration_s, progress=plan.progress,
                        label=policy)  # fmt: skip


def _summary(
    result: RunResult,
    infos: Sequence[workers.WorkerInfo],
    before: Mapping[str, workers.Counters],
    after: Mapping[str, workers.Counters],
) -> dict[str, Any]:
    """Per-worker counts from the router's header, else from the engines' request counters."""
    from_header = {r.worker for r in result.records if r.worker}
    per_worker = None if from_header else workers.requests_delta(before, after)
    summary = summarize(result, per_worker)
    tokens = workers.prompt_tokens_delta(before, after)
    summary["engine_metrics_hit_rate"] = workers.engine_hit_rate(before, after)
    summary["busy_fraction"] = workers.busy_fraction(before, after, result.wall_s)
    summary["hit_rate_source"] = "responses (usage.prompt_tokens_details.cached_tokens)"
    if summary["hit_rate"] is None and summary["engine_metrics_hit_rate"] is not None:
        summary["hit_rate"] = summary["engine_metrics_hit_rate"]
        summary["hit_rate_source"] = "engine metrics (prefix-cache hits / queries)"
    summary["prompt_tokens_per_worker"] = tokens
    summary["preemptions_per_worker"] = workers.preemptions_delta(before, after)
    summary["load_imbalance_tokens"] = imbalance(tokens) if tokens else None
    summary["requests_per_worker_source"] = _source(bool(from_header), per_worker is not None)
    summary["load_imbalance_basis"] = "requests"
    if summary["load_imbalance"] is None and tokens:
        summary["load_imbalance"] = imbalance(tokens)
        summary["load_imbalance_basis"] = "prompt tokens (engine counters; requests per worker unknown)"
    return summary


def _source(header: bool, counters: bool) -> str:
    if header:
        return "router header"
    return "engine counters" if counters else "unknown"


async def _reset(infos: Sequence[workers.WorkerInfo], notes: list[str], out: Console) -> None:
    done = await workers.reset_all(infos)
    missing = [url for url, ok in done.items() if not ok]
    if missing:
        note = f"prefix cache not reset on {', '.join(missing)} (no flush call): later policies start warm"
        if note not in notes:
            notes.append(note)
            out.print(f"[yellow]warning:[/] {note}")
