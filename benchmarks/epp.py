"""prefix-router as an endpoint picker behind a real Envoy, side by side with its own proxy and with
sglang-router, in one run (issue 25).

Part 1, the data path (an instant worker, ``bench.instant_worker``: simulated, it answers at once): rounds
interleaved over

- ``direct``: no proxy (the yardstick of added latency);
- ``prefix-router``: ``serve --processes 1 --policy prefix``, as shipped;
- ``envoy+epp``: Envoy (``lab.launch.envoy``, ``--envoy-threads`` workers) -> ``prefix-router epp``
  (policy prefix), the worker addressed by the picker's ``x-gateway-destination-endpoint``; the request
  body FULL_DUPLEX_STREAMED as the reference gateways send it;
- ``envoy+epp buffered``: the same with the request body BUFFERED (one message, nothing streamed back);
- ``envoy+epp lean``: FULL_DUPLEX_STREAMED, the response headers skipped (the filter's
  ``response_header_mode: SKIP``, the picker without decision headers): 2 messages fewer per request;
- ``envoy+grpc floor``: the same Envoy as ``envoy+epp`` in front of ``floor_servers/extproc_floor.py``, a
  grpc.aio ext_proc server on the picker's stack that answers every message with a prebuilt response
  (one fixed destination, no routing): what any grpc.aio picker pays per request;
- ``sglang-router``: ``cache_aware`` from its own venv (``--peer-python``; left out when missing).

Printed per case (non-streamed, streamed with 8 SSE events): the best round's req/s, the median latency
added over direct, and the CPU per request of each component (user+system of its process tree): for
``envoy+epp`` Envoy's, the picker's and their sum. Then, per case, the ext_proc server's CPU per request
against ``serve``'s, for the floor and for the picker, measured in the same rounds.

Part 2, routing on engines (``--engines sim``: ``engine-sim``, simulated, ``--instances`` of them, 4 by
default; ``--engines vllm``: real vLLM CPU engines, ``lab.launch.vllm.VllmFleet``, 2 by default, the model
and weights as ``launch.vllm`` finds them): the same workload
(``--workload``, ``--seed``) through ``serve`` and through Envoy + ``epp`` (both body modes), each
fresh, each engine's cache flushed before (``prefix-router bench --router URL``): the engine-reported
hit rate of each, its difference in points, requests per worker, and the router's CPU per request (the
picker's alone, and with Envoy). ``serve`` runs again last: how far the same edge moves between runs.
``--edges`` picks the rows; beside those, ``sglang-router`` (``cache_aware`` on every engine, from
``--peer-python``) and ``direct`` (no router: the client sends its sessions to the engines round robin,
each engine its share of the concurrency). Per row also: requests per second of the closed loop, TTFT and
latency p50 and what each adds over ``direct``'s, and the engines' own hit rate (their prefix-cache
counters between the row's scrapes). At real-engine speeds a row lasts tens of seconds, so a router's CPU
per request includes its background work (health checks, metrics) over that time. ``--hit-rounds N``
runs the rows N times, each round in another order, and prints one table per round.

    python benchmarks/epp.py --requests 2000 --rounds 3 --workload multi-turn --hit-requests 400
    python benchmarks/epp.py --skip-data-path --engines vllm --hit-requests 200 --hit-concurrency 4
    python benchmarks/epp.py --skip-data-path --engines vllm --workload chatbots --hit-requests 60 \
        --hit-concurrency 4 --edges "direct,prefix-router,envoy+epp,sglang-router,prefix-router again"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prefix_router.lab.bench import loadgen, workers
from prefix_router.lab.bench.harness import BenchPlan, warm_up
from prefix_router.lab.bench.overhead import (
    PEER_ENV,
    PEER_PYTHON,
    bodies,
    cpu_seconds,
    peer_argv,
    processes,
    router_argv,
    wait_listening,
)
from prefix_router.lab.bench.runner import RunnerSettings, RunResult, run_workload
from prefix_router.lab.bench.summary import summarize
from prefix_router.lab.launch.engine_sim import start_engines
from prefix_router.lab.launch.envoy import EnvoyOptions, EnvoyPorts, envoy_argv
from prefix_router.lab.launch.net import free_port, wait_until_ok
from prefix_router.lab.launch.vllm import VllmFleet, VllmSettings
from prefix_router.lab.workloads.arrivals import Arrivals
from prefix_router.lab.workloads.registry import get_workload
from prefix_router.lab.workloads.types import Workload
from prefix_router.node import loop_factory

CLI = [sys.executable, "-c", "import sys; from prefix_router.cli import main; main(sys.argv[1:])"]
DIRECT, SERVE, GATEWAY, SGLANG = "direct", "prefix-router", "envoy+epp", "sglang-router"
SERVE_AGAIN = "prefix-router again"  # part 2's last run: serve's own run-to-run spread, in the same run
SERVE_SET = "prefix-router set"  # serve with the routing knobs of --serve-set, beside the defaults' row
FLOOR = "envoy+grpc floor"  # the same Envoy in front of a do-nothing grpc.aio ext_proc server
FLOOR_SERVER = Path(__file__).resolve().parent / "floor_servers" / "extproc_floor.py"
BUFFERED = "envoy+epp buffered"  # the request body BUFFERED instead of FULL_DUPLEX_STREAMED
LEAN = "envoy+epp lean"  # no response headers to the picker (and so no decision headers)
OPTIONS = {
    GATEWAY: EnvoyOptions(),
    FLOOR: EnvoyOptions(),
    BUFFERED: EnvoyOptions(request_body_mode="BUFFERED"),
    LEAN: EnvoyOptions(response_header_mode="SKIP"),
}
NO_DECISION_HEADERS = ("--set", "tenants.decision_headers=false")
EDGES = (SERVE, SERVE_SET, GATEWAY, BUFFERED, LEAN, SGLANG, DIRECT, SERVE_AGAIN)  # part 2's rows, in order
PICKERS = (GATEWAY, BUFFERED, LEAN)
RoutingRow = tuple[str, dict[str, object], dict[str, float], int]  # label, bench row, CPU s/req, requests


@dataclass
class Target:
    name: str
    port: int
    pids: dict[str, int]  # component -> pid


@dataclass
class Sample:
    rate: float
    p50_s: float
    cpu_s: dict[str, float]  # component -> CPU seconds per request
    errors: int


@dataclass
class Runs:
    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)  # (kind, target)

    def best(self, kind: str, target: str) -> Sample:
        runs = self.samples[kind, target]
        components = runs[0].cpu_s
        return Sample(
            max(s.rate for s in runs),
            min(s.p50_s for s in runs),
            {c: min(s.cpu_s[c] for s in runs) for c in components},
            sum(s.errors for s in runs),
        )


def epp_argv(workers: list[str], grpc_port: int, http_port: int, *extra: str) -> list[str]:
    argv = [*CLI, "epp", "--grpc-port", str(grpc_port), "--port", str(http_port), "--policy", "prefix"]
    for url in workers:
        argv += ["--worker", url]
    return [*argv, *extra]


def serve_argv(workers: list[str], port: int, *extra: str) -> list[str]:
    argv = [*CLI, "serve", "--port", str(port), "--processes", "1", "--policy", "prefix"]
    for url in workers:
        argv += ["--worker", url]
    return [*argv, *extra]


Spawn = Callable[[list[str], dict[str, str] | None], int]  # processes()'s: (argv, env) -> pid


def spawn_gateway(
    spawn: Spawn, workers: list[str], directory: Path, threads: int, name: str = GATEWAY
) -> Target:
    grpc_port, http_port, listen = free_port(), free_port(), free_port()
    extra = NO_DECISION_HEADERS if name == LEAN else ()
    epp = spawn(epp_argv(workers, grpc_port, http_port, "--set", "log_level=warning", *extra), None)
    ports = EnvoyPorts(listen=listen, admin=free_port(), epp=grpc_port)
    envoy = spawn(envoy_argv(directory, ports, OPTIONS[name], threads), None)
    return Target(name, listen, {"envoy": envoy, "epp": epp})


def spawn_floor(spawn: Spawn, worker_port: int, directory: Path, threads: int) -> Target:
    grpc_port, listen = free_port(), free_port()
    argv = [sys.executable, str(FLOOR_SERVER), "--port", str(grpc_port)]
    floor = spawn([*argv, "--destination", f"127.0.0.1:{worker_port}"], None)
    ports = EnvoyPorts(listen=listen, admin=free_port(), epp=grpc_port)
    envoy = spawn(envoy_argv(directory, ports, OPTIONS[FLOOR], threads), None)
    return Target(FLOOR, listen, {"envoy": envoy, "floor": floor})


async def measure(target: Target, sent: list[bytes], concurrency: int) -> Sample:
    before = {c: cpu_seconds(pid) for c, pid in target.pids.items()}
    result = await loadgen.run(target.port, sent, concurrency)
    after = {c: cpu_seconds(pid) for c, pid in target.pids.items()}
    cpu = {c: (after[c] - before[c]) / len(sent) for c in target.pids}
    return Sample(result.rate, result.percentile(0.5), cpu, result.errors)


async def data_path(args: argparse.Namespace, console: Console, directory: Path) -> tuple[Runs, list[str]]:
    runs = Runs()
    with processes() as spawn:
        worker_port = free_port()
        worker = [sys.executable, "-m", "prefix_router.lab.bench.instant_worker", "--port", str(worker_port)]
        targets = [Target(DIRECT, worker_port, {"worker": spawn([*worker, "--chunks", "8"], None)})]
        url = f"http://127.0.0.1:{worker_port}"
        port = free_port()
        targets.append(
            Target(SERVE, port, {"serve": spawn(router_argv(worker_port, port, "uvloop", 1), None)})
        )
        targets.append(spawn_gateway(spawn, [url], directory, args.envoy_threads))
        targets.append(spawn_gateway(spawn, [url], directory, args.envoy_threads, BUFFERED))
        targets.append(spawn_gateway(spawn, [url], directory, args.envoy_threads, LEAN))
        targets.append(spawn_floor(spawn, worker_port, directory, args.envoy_threads))
        if Path(args.peer_python).exists():
            port = free_port()
            targets.append(
                Target(
                    SGLANG, port, {"sglang": spawn(peer_argv(args.peer_python, worker_port, port), PEER_ENV)}
                )
            )
        for target in targets:
            await wait_listening(target.port, 120)  # a loaded machine starts them slowly
        sent = {
            "plain": bodies(args.requests, args.prompt_chars, False),
            "stream": bodies(max(1, args.requests // 2), args.prompt_chars, True),
        }
        for target in targets:  # warm-up, unmeasured
            await loadgen.run(target.port, sent["plain"][: args.requests // 4], args.concurrency)
        for round_ in range(args.rounds):
            order = targets[round_ % len(targets) :] + targets[: round_ % len(targets)]
            for kind, requests in sent.items():
                for target in order:
                    runs.samples.setdefault((kind, target.name), []).append(
                        await measure(target, requests, args.concurrency)
                    )
            console.print(f"round {round_ + 1}/{args.rounds} done")
    return runs, [t.name for t in targets]


def report_data_path(runs: Runs, names: list[str], args: argparse.Namespace, console: Console) -> None:
    for kind in ("plain", "stream"):
        unit = "req/s" if kind == "plain" else "streams/s"
        title = (
            f"{args.prompt_chars}-char chat prompts, concurrency {args.concurrency}, "
            f"{'non-streamed' if kind == 'plain' else 'streamed (8 SSE events)'}, "
            f"instant worker (simulated): best of {args.rounds} rounds"
        )
        table = Table(title=title)
        for column in ("target", unit, "x prefix-router", "p50 ms", "added p50 ms", "CPU us/req",
                       "of which", "errors"):  # fmt: skip
            table.add_column(column, justify="right")
        direct, ours = runs.best(kind, DIRECT), runs.best(kind, SERVE)
        for name in names:
            f = runs.best(kind, name)
            total = sum(f.cpu_s.values())
            parts = " + ".join(f"{c} {v * 1e6:.0f}" for c, v in f.cpu_s.items()) if len(f.cpu_s) > 1 else ""
            table.add_row(
                name, f"{f.rate:,.0f}", f"{f.rate / ours.rate:.2f}", f"{f.p50_s * 1e3:.2f}",
                f"{(f.p50_s - direct.p50_s) * 1e3:.2f}", f"{total * 1e6:.0f}", parts, str(f.errors),
            )  # fmt: skip
        console.print(table)
        report_floor(runs, kind, console)


def report_floor(runs: Runs, kind: str, console: Console) -> None:
    """The ext_proc server's CPU per request against ``serve``'s: the floor's, then each picker's and what
    it costs above the floor (the picker's own work), all from the same rounds."""
    serve = runs.best(kind, SERVE).cpu_s["serve"]
    floor = runs.best(kind, FLOOR).cpu_s["floor"]
    parts = [f"grpc floor {floor * 1e6:.0f} us = {floor / serve:.2f}x serve ({serve * 1e6:.0f} us)"]
    for name in (GATEWAY, BUFFERED, LEAN):
        epp = runs.best(kind, name).cpu_s["epp"]
        parts.append(f"{name} picker {epp * 1e6:.0f} us = {epp / serve:.2f}x ({(epp - floor) * 1e6:+.0f} us)")
    console.print(f"{kind}: ext_proc server CPU per request: " + "; ".join(parts))


@dataclass(frozen=True)
class EnginePlan:
    """Part 2's engines: ``kind`` sim (engine-sim, simulated) or vllm (real CPU engines), ``instances``."""

    kind: str
    instances: int
    time_scale: float = 0.02  # engine-sim only
    port_base: int = 0  # vllm only: the engines' ports from here (0: free ports)

    @property
    def simulated(self) -> bool:
        return self.kind == "sim"

    def describe(self) -> str:
        if self.simulated:
            return f"{self.instances} engine-sim engines (simulated)"
        return f"{self.instances} real vLLM CPU engines"

    def vllm_settings(self, log_dir: Path | None = None) -> VllmSettings:
        # 4,096-token caches (32 blocks of 128), as benchmarks/vllm_real.py: routing decides the hits
        return VllmSettings(instances=self.instances, kv_cache_tokens=4096, max_num_seqs=8, log_dir=log_dir,
                            port_base=self.port_base)  # fmt: skip


def engine_plan(args: argparse.Namespace) -> EnginePlan:
    instances = args.instances if args.instances is not None else (4 if args.engines == "sim" else 2)
    return EnginePlan(args.engines, instances, args.time_scale, args.port_base)


@contextmanager
def start_plan(plan: EnginePlan, directory: Path) -> Iterator[list[str]]:
    """The engines' URLs while they run."""
    if plan.simulated:
        with start_engines(plan.instances, profile="cpu-demo", time_scale=plan.time_scale) as engines:
            yield engines
        return
    with VllmFleet(plan.vllm_settings(directory / "engines")) as fleet:
        yield fleet.urls


def bench_argv(url: str, engines: list[str], label: str, args: argparse.Namespace, out: Path) -> list[str]:
    """``prefix-router bench`` against ``url`` (``--simulated`` only in front of simulated engines)."""
    argv = [*CLI, "bench", "--workers", *engines, "--router", url, "--label", label]
    argv += ["--simulated"] if engine_plan(args).simulated else []
    argv += ["--workload", args.workload, "--requests", str(args.hit_requests), "--seed", str(args.seed)]
    argv += ["--concurrency", str(args.hit_concurrency), "--no-progress", "--json", str(out)]
    for option in args.hit_workload_opt or ():
        argv += ["--workload-opt", option]
    return argv


def bench_router(
    url: str, engines: list[str], label: str, args: argparse.Namespace, out: Path
) -> dict[str, object]:
    argv = bench_argv(url, engines, label, args, out)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    document = json.loads(out.read_text())
    row: dict[str, object] = document["policies"][label]
    return row


def wait_http(url: str, timeout_s: float = 60.0) -> None:
    """Block until ``GET url`` answers 200 (the servers are other processes: nothing waits on this loop)."""
    if not wait_until_ok(url, time.monotonic() + timeout_s, interval_s=0.1):
        raise RuntimeError(f"{url} did not answer in time")


def sglang_argv(python: str, engines: list[str], port: int) -> list[str]:
    """sglang-router's ``cache_aware`` over every engine on loopback (router and its metrics), quiet."""
    return [
        python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *engines, "--policy", "cache_aware",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warn",
    ]  # fmt: skip


def bench_workload(args: argparse.Namespace) -> Workload:
    """The workload ``bench_argv`` has ``prefix-router bench`` replay, built the same way here."""
    options = dict(option.split("=", 1) for option in args.hit_workload_opt or ())
    arrivals = Arrivals("closed", concurrency=args.hit_concurrency)
    return get_workload(args.workload, requests=args.hit_requests, seed=args.seed, model="",
                        arrivals=arrivals, **options)  # fmt: skip


def round_robin(workload: Workload, parts: int) -> list[Workload]:
    """``workload``'s sessions dealt to ``parts`` workloads in turn, each with its share of the closed
    loop's concurrency (at least 1); a part may be empty when there are fewer sessions than parts."""
    width = max(1, (workload.concurrency or parts) // parts)
    return [
        Workload(workload.name, workload.sessions[i::parts], workload.description, width)
        for i in range(parts)
    ]


async def direct_row(engines: list[str], args: argparse.Namespace) -> dict[str, object]:
    """``direct``: the workload sent straight to the engines round robin (no router), the caches flushed
    first as ``bench`` does, summarised in ``bench``'s schema with the engines' own hit rate."""
    infos = await workers.describe_all(engines)
    model = next((i.model for i in infos if i.model), None) or "default"
    workload = bench_workload(args)
    await warm_up(BenchPlan(tuple(engines), (DIRECT,), workload, model=model))  # as bench does
    await workers.reset_all(infos)
    await asyncio.sleep(0.2)
    before = await workers.counters_all(infos)
    dealt = zip(engines, round_robin(workload, len(engines)), strict=True)
    shares = [(url, part) for url, part in dealt if part.sessions]
    results = await asyncio.gather(
        *(run_workload(part, RunnerSettings(base_url=url, model=model, progress=False, label=DIRECT))
          for url, part in shares)
    )  # fmt: skip
    after = await workers.counters_all(infos)
    merged = RunResult([r for result in results for r in result.records], max(r.wall_s for r in results))
    row = summarize(merged, {url: len(r.records) for (url, _), r in zip(shares, results, strict=True)})
    row["engine_metrics_hit_rate"] = workers.engine_hit_rate(before, after)
    return row


def start_edge(spawn: Spawn, label: str, engines: list[str], args: argparse.Namespace,
               directory: Path) -> tuple[str, dict[str, int]]:  # fmt: skip
    """Start the router of row ``label`` (not ``direct``): its URL once it answers, and its pids."""
    port = free_port()
    if label in (SERVE, SERVE_AGAIN, SERVE_SET):
        knobs = (
            [arg for pair in args.serve_set or () for arg in ("--set", pair)] if label == SERVE_SET else []
        )
        pids = {"serve": spawn(serve_argv(engines, port, "--set", "log_level=warning", *knobs), None)}
        wait_http(f"http://127.0.0.1:{port}/ready")
    elif label == SGLANG:
        pids = {"sglang": spawn(sglang_argv(args.peer_python, engines, port), PEER_ENV)}
        wait_http(f"http://127.0.0.1:{port}/health", 120)
    else:
        target = spawn_gateway(spawn, engines, directory, args.envoy_threads, label)
        port, pids = target.port, target.pids
        wait_http(f"http://127.0.0.1:{port}/v1/models")
    return f"http://127.0.0.1:{port}", pids


def edges(args: argparse.Namespace) -> list[str]:
    """``--edges`` checked and in ``EDGES``'s order; ``sglang-router`` dropped when its venv is missing."""
    chosen = [e.strip() for e in args.edges.split(",") if e.strip()]
    unknown = sorted(set(chosen) - set(EDGES))
    if unknown:
        raise SystemExit(f"unknown edges {unknown}; known: {', '.join(EDGES)}")
    if SGLANG in chosen and not Path(args.peer_python).exists():
        chosen.remove(SGLANG)
    if SERVE_SET in chosen and not args.serve_set:
        raise SystemExit(f"the {SERVE_SET!r} row needs --serve-set KEY=VALUE")
    return [e for e in EDGES if e in chosen]


def rotated(names: list[str], round_: int) -> list[str]:
    """``names`` started ``round_`` places later, wrapping: each round puts another row first."""
    k = round_ % len(names) if names else 0
    return names[k:] + names[:k]


def routing(args: argparse.Namespace, console: Console, directory: Path) -> list[list[RoutingRow]]:
    """Per round (``--hit-rounds``, each in another order), one row per edge, in ``EDGES``'s order."""
    rounds: list[list[RoutingRow]] = []
    chosen = edges(args)
    with start_plan(engine_plan(args), directory) as engines:
        for round_ in range(args.hit_rounds):
            rows = [edge_row(label, engines, args, directory) for label in rotated(chosen, round_)]
            rounds.append(sorted(rows, key=lambda r: EDGES.index(r[0])))
            console.print(f"round {round_ + 1}/{args.hit_rounds} done ({', '.join(rotated(chosen, round_))})")
    return rounds


def edge_row(label: str, engines: list[str], args: argparse.Namespace, directory: Path) -> RoutingRow:
    """One edge's run of the workload: its ``bench`` row and its components' CPU seconds per request."""
    if label == DIRECT:
        row = asyncio.run(direct_row(engines, args))
        return label, row, {}, int(row.get("requests") or 1)  # type: ignore[call-overload]
    with processes() as spawn:
        url, pids = start_edge(spawn, label, engines, args, directory)
        before = {c: cpu_seconds(p) for c, p in pids.items()}
        row = bench_router(url, engines, label, args, directory / f"{label}.json")
        after = {c: cpu_seconds(p) for c, p in pids.items()}
    requests = int(row.get("requests") or 1)  # type: ignore[call-overload]
    return label, row, {c: (after[c] - before[c]) / requests for c in pids}, requests


def p50_ms(row: dict[str, object], key: str) -> float | None:
    """The p50 in ms of ``row[key]`` (``ttft_ms`` or ``e2e_ms`` of ``bench``'s schema), None if missing."""
    value = row.get(key)
    p50 = value.get("p50") if isinstance(value, dict) else None
    return float(p50) if p50 is not None else None


def added(value: float | None, base: float | None) -> str:
    """``value - base`` in ms, signed, or n/a without both."""
    return "n/a" if value is None or base is None else f"{value - base:+.0f}"


def rate(value: object) -> str:
    """A 0-1 rate as a percentage with one decimal, or n/a."""
    return "n/a" if value is None else f"{float(value) * 100:.1f} %"  # type: ignore[arg-type]


def routing_cells(rows: list[RoutingRow]) -> list[list[str]]:
    """The routing table's cells per row: latency added over the ``direct`` row's p50 (n/a without one),
    the engines' hit rate, and the router's CPU per request with each component's share."""
    base = next((row for label, row, _, _ in rows if label == DIRECT), {})
    base_ttft, base_e2e = p50_ms(base, "ttft_ms"), p50_ms(base, "e2e_ms")
    out = []
    for label, row, cpu, _ in rows:
        ttft, e2e = p50_ms(row, "ttft_ms"), p50_ms(row, "e2e_ms")
        parts = " + ".join(f"{c} {v * 1e6:,.0f}" for c, v in cpu.items()) if len(cpu) > 1 else ""
        out.append([
            label, str(row.get("requests")), str(row.get("errors")), f"{float(row['throughput_rps']):.2f}",  # type: ignore[arg-type]
            "n/a" if ttft is None else f"{ttft:.0f}", added(ttft, base_ttft),
            "n/a" if e2e is None else f"{e2e:.0f}", added(e2e, base_e2e),
            rate(row.get("engine_metrics_hit_rate")), rate(row.get("hit_rate")),
            per_worker(row.get("requests_per_worker")), f"{sum(cpu.values()) * 1e6:,.0f}" if cpu else "-",
            parts,
        ])  # fmt: skip
    return out


def per_worker(counts: object) -> str:
    """Requests per worker as ``a / b``, the workers in address order (``http://`` or not), or n/a."""
    if not isinstance(counts, dict) or not counts:
        return "n/a"
    by_address = {str(url).removeprefix("http://"): n for url, n in counts.items()}
    return " / ".join(str(by_address[a]) for a in sorted(by_address))


def engines_hit(row: dict[str, object]) -> float:
    """The engines' own hit rate of a row (0 when they reported none)."""
    return float(row.get("engine_metrics_hit_rate") or 0)  # type: ignore[arg-type]


def verdicts(rows: list[RoutingRow]) -> list[str]:
    """Each picker row's hit rate against the first ``serve`` row's (the engines' counters) and its
    picker's CPU per request against ``serve``'s; ``serve again``'s spread; nothing without ``serve``."""
    serve = next(((row, cpu) for label, row, cpu, _ in rows if label == SERVE), None)
    if serve is None:
        return []
    lines = []
    for label, row, cpu, _ in rows:
        if label not in (*PICKERS, SERVE_AGAIN):
            continue
        diff = (engines_hit(row) - engines_hit(serve[0])) * 100
        if label == SERVE_AGAIN:
            lines.append(f"{label}: hit rate minus the first run's {diff:+.2f} points (the same edge twice)")
            continue
        ratio = cpu["epp"] / serve[1]["serve"]
        lines.append(
            f"{label}: hit rate minus serve's {diff:+.2f} points, target within 1: "
            f"{verdict(abs(diff) <= 1)}; the picker's CPU per request / serve's {ratio:.2f}, "
            f"target at or below 1: {verdict(ratio <= 1)}"
        )
    return lines


def report_routing(
    rows: list[RoutingRow], args: argparse.Namespace, console: Console, round_: int = 1
) -> None:
    table = Table(
        title=f"round {round_}/{args.hit_rounds}: {args.workload} workload, {args.hit_requests} requests, "
        f"closed loop at concurrency {args.hit_concurrency}, {engine_plan(args).describe()}: "
        "the same engines for every row"
    )
    for column in ("edge", "requests", "errors", "req/s", "TTFT p50 ms", "added", "latency p50 ms", "added",
                   "hit rate (engines)", "hit rate (usage)", "requests per worker", "router CPU us/req",
                   "of which"):  # fmt: skip
        table.add_column(column, justify="right")
    for cells in routing_cells(rows):
        table.add_row(*cells)
    console.print(table)
    for line in verdicts(rows):
        console.print(line)


def verdict(met: bool) -> str:
    return "met" if met else "NOT MET"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000, help="non-streamed requests per measurement")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-chars", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--envoy-threads", type=int, default=2, help="Envoy's --concurrency")
    p.add_argument(
        "--peer-python", default=PEER_PYTHON if Path(PEER_PYTHON).exists() else "/tmp/peers/bin/python"
    )
    p.add_argument("--engines", choices=("sim", "vllm"), default="sim", help="part 2's engines")
    p.add_argument("--instances", type=int, help="part 2's engines (default: 4 sim, 2 vllm)")
    p.add_argument("--time-scale", type=float, default=0.02, help="engine-sim wall seconds per model second")
    p.add_argument("--workload", default="multi-turn")
    p.add_argument("--hit-requests", type=int, default=400)
    p.add_argument("--hit-concurrency", type=int, default=16)
    p.add_argument("--hit-rounds", type=int, default=1, help="part 2's rounds, each in another order")
    p.add_argument("--hit-workload-opt", action="append", metavar="KEY=VALUE", help="part 2's workload")
    p.add_argument(
        "--edges", default=",".join(EDGES), help=f"part 2's rows, comma-separated: {', '.join(EDGES)}"
    )
    p.add_argument(
        "--serve-set", action="append", metavar="KEY=VALUE",
        help=f"the {SERVE_SET!r} row's knobs (serve --set), e.g. routing.policies.prefix.load_factor=1.5",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port-base", type=int, default=0, help="real vLLM engines' first port (0: free ports)")
    p.add_argument("--skip-data-path", action="store_true")
    p.add_argument("--skip-routing", action="store_true")
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    console = Console(width=170, force_terminal=False)
    console.print(
        f"epp benchmark: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        loop = loop_factory("uvloop")()
        try:
            if not args.skip_data_path:
                runs, names = loop.run_until_complete(data_path(args, console, directory))
                report_data_path(runs, names, args, console)
            if not args.skip_routing:
                for round_, rows in enumerate(routing(args, console, directory), 1):
                    report_routing(rows, args, console, round_)
        finally:
            loop.close()
    console.print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
