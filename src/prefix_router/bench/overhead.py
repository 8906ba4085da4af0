"""``prefix-router bench-overhead``: what the router adds next to an engine that answers at once.

One run starts an instant worker and one router per upstream client (aiohttp's, the default, and the lean
``h1`` one) and event loop (uvloop by default; ``--loops uvloop,asyncio`` compares loops too) as separate
processes, then measures, round after round and side by side with a direct connection to the worker:
added latency (p50/p99, one request at a time), non-streaming throughput and streams per second (at a
fixed concurrency). Throughput figures are also given as ratios to the direct connection.
``--access-log on,off`` adds routers without the access log (on by default, as shipped) to measure it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from prefix_router.bench import loadgen
from prefix_router.launch.net import free_port, wait_until_ok
from prefix_router.proxy.server import loop_factory


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench-overhead", help="measure the router's added latency and throughput vs direct")
    p.add_argument("--requests", type=int, default=10_000, help="requests per throughput measurement")
    p.add_argument("--latency-requests", type=int, default=3_000, help="sequential requests per latency run")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best round is reported")
    p.add_argument("--prompt-chars", type=int, default=2_000, help="size of the chat prompt sent")
    p.add_argument("--stream-chunks", type=int, default=8, help="SSE events per streamed answer")
    p.add_argument("--loops", default="uvloop", help="router event loops to compare (uvloop,asyncio)")
    p.add_argument("--clients", default="aiohttp,h1", help="router upstream clients to compare")
    p.add_argument("--access-log", default="on", help="router access log settings to compare (on,off)")
    p.set_defaults(func=run_bench)


@dataclass
class Figures:
    p50_s: float = float("inf")
    p99_s: float = float("inf")
    rps: float = 0.0
    sps: float = 0.0
    cpu_plain_s: float = float("inf")  # server CPU seconds per non-streaming request
    cpu_stream_s: float = float("inf")
    errors: int = 0

    def merge(self, other: Figures) -> None:
        """Keep the best of rounds (least disturbed by the rest of the machine)."""
        if other.p50_s < self.p50_s:
            self.p50_s, self.p99_s = other.p50_s, other.p99_s
        self.rps, self.sps = max(self.rps, other.rps), max(self.sps, other.sps)
        self.cpu_plain_s = min(self.cpu_plain_s, other.cpu_plain_s)
        self.cpu_stream_s = min(self.cpu_stream_s, other.cpu_stream_s)
        self.errors += other.errors


@dataclass
class Plan:
    latency: list[bytes]
    plain: list[bytes]
    streams: list[bytes]
    concurrency: int
    targets: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (port, server pid)

    @property
    def per_target(self) -> int:
        return len(self.latency) + len(self.plain) + len(self.streams)


def bodies(n: int, prompt_chars: int, stream: bool) -> list[bytes]:
    system = ("You are a helpful assistant for a benchmark. " * (prompt_chars // 45 + 1))[:prompt_chars]
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"question {i}"}]
        body = orjson.dumps({"model": "instant", "messages": messages, "max_tokens": 8, "stream": stream})
        out.append(loadgen.request_bytes("/v1/chat/completions", body))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux ``/proc``; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def processes() -> Iterator[Callable[[list[str]], int]]:
    """Spawn helper processes (stderr discarded: a failure shows as a port that never answers)."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(argv: list[str]) -> int:
        procs.append(
            subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        return procs[-1].pid

    try:
        yield spawn
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def wait_ready(port: int, path: str, timeout_s: float = 20.0) -> None:
    """Until ``GET path`` answers 200: the worker's ``/health``, a router's ``/ready`` (its worker is up)."""
    url, deadline = f"http://127.0.0.1:{port}{path}", time.monotonic() + timeout_s
    if not await asyncio.to_thread(wait_until_ok, url, deadline, interval_s=0.1):
        raise RuntimeError(f"{url} did not answer 200 in time")


async def measure(port: int, pid: int, plan: Plan, tick: Callable[[], None]) -> Figures:
    latency = await loadgen.run(port, plan.latency, 1, tick)
    cpu0 = cpu_seconds(pid)
    plain = await loadgen.run(port, plan.plain, plan.concurrency, tick)
    cpu1 = cpu_seconds(pid)
    streams = await loadgen.run(port, plan.streams, plan.concurrency, tick)
    cpu2 = cpu_seconds(pid)
    return Figures(
        p50_s=latency.percentile(0.5),
        p99_s=latency.percentile(0.99),
        rps=plain.rate,
        sps=streams.rate,
        cpu_plain_s=(cpu1 - cpu0) / len(plan.plain),
        cpu_stream_s=(cpu2 - cpu1) / len(plan.streams),
        errors=latency.errors + plain.errors + streams.errors,
    )


async def bench(args: argparse.Namespace, console: Console) -> dict[str, Figures]:
    worker_port = free_port()
    loops, clients = names(args.loops), names(args.clients)
    plan = Plan(
        latency=bodies(args.latency_requests, args.prompt_chars, False),
        plain=bodies(args.requests, args.prompt_chars, False),
        streams=bodies(max(1, args.requests // 2), args.prompt_chars, True),
        concurrency=args.concurrency,
    )
    with processes() as spawn:
        worker = ["-m", "prefix_router.bench.instant_worker", "--port", str(worker_port)]
        plan.targets["direct"] = (worker_port, spawn([*worker, "--chunks", str(args.stream_chunks)]))
        for loop in loops:
            for client in clients:
                for access in names(args.access_log):
                    port = free_port()
                    argv = [
                        *router_argv(worker_port, port, loop, client),
                        "--set",
                        f"access_log={access == 'on'}",
                    ]
                    suffix = "" if access == "on" else ", no access log"
                    plan.targets[f"router ({client}, {loop}{suffix})"] = (port, spawn(argv))
        for name, (port, _) in plan.targets.items():
            await wait_ready(port, "/health" if name == "direct" else "/ready")
        return await rounds(plan, args.rounds, console)


def names(csv: str) -> list[str]:
    return [name.strip() for name in csv.split(",") if name.strip()]


def router_argv(worker_port: int, port: int, loop: str, client: str = "aiohttp") -> list[str]:
    return [
        "-m", "prefix_router.proxy", "serve",
        "--worker", f"http://127.0.0.1:{worker_port}",
        "--port", str(port),
        "--set", f"event_loop={loop}",
        "--set", f"upstream_client={client}",
        "--set", "log_level=warning",
    ]  # fmt: skip


async def rounds(plan: Plan, n: int, console: Console) -> dict[str, Figures]:
    results = {name: Figures() for name in plan.targets}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("bench-overhead", total=n * len(plan.targets) * plan.per_target)

        def tick() -> None:
            progress.advance(task)

        for _ in range(n):
            for name, (port, pid) in plan.targets.items():
                results[name].merge(await measure(port, pid, plan, tick))
    return results


COLUMNS = (
    "target", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "req/s", "vs direct", "streams/s",
    "vs direct", "CPU us/req", "CPU us/stream", "errors",
)  # fmt: skip


def row(name: str, f: Figures, direct: Figures) -> list[str]:
    return [
        name, f"{f.p50_s * 1e3:.3f}", f"{f.p99_s * 1e3:.3f}",
        f"{(f.p50_s - direct.p50_s) * 1e3:.3f}", f"{(f.p99_s - direct.p99_s) * 1e3:.3f}",
        f"{f.rps:,.0f}", f"{f.rps / direct.rps:.2f}", f"{f.sps:,.0f}", f"{f.sps / direct.sps:.2f}",
        f"{f.cpu_plain_s * 1e6:.0f}", f"{f.cpu_stream_s * 1e6:.0f}", str(f.errors),
    ]  # fmt: skip


def report(results: dict[str, Figures], args: argparse.Namespace, console: Console) -> None:
    table = Table(
        title=f"bench-overhead: instant worker, {args.prompt_chars}-char chat prompts, "
        f"concurrency {args.concurrency}, {os.cpu_count()} CPUs, best of {args.rounds} rounds"
    )
    for column in COLUMNS:
        table.add_column(column, justify="right", no_wrap=column == "target")
    for name, figures in results.items():
        table.add_row(*row(name, figures, results["direct"]))
    console.print(table)
    console.print(
        "CPU: the server process's CPU time per request (the worker's for direct). Load generator, worker "
        "and routers share this machine's cores, so req/s also depends on whatever else runs on it."
    )


def run_bench(args: argparse.Namespace) -> int:
    console = Console(width=max(150, Console().width))
    loop = loop_factory("uvloop")()
    try:
        results = loop.run_until_complete(bench(args, console))
    finally:
        loop.close()
    report(results, args, console)
    return 0 if all(f.errors == 0 for f in results.values()) else 1
