"""The floor of a Python proxy, side by side with prefix-router and sglang-router in one run (issue 15).

How much of sglang-router's (Rust) throughput does a Python proxy reach that does NOTHING but forward?
One instant worker (``bench.instant_worker``), one load generator (``bench.loadgen``), and in front of
the worker, each as its own process:

- ``direct``: no proxy (the client talks to the worker; CPU is the worker's);
- ``floor-aiohttp``: aiohttp's server + the project's upstream client, a handler that only forwards
  (``benchmarks/floor_servers/aiohttp_floor.py``);
- ``floor-aiohttp-direct``: aiohttp as prefix-router drives it (``serve``'s runner and ``Dispatch``, a
  plain route, the answer written by ``edge.head``), the same forwarding
  (``floor_servers/aiohttp_direct_floor.py``);
- ``floor-protocol``: ``asyncio.Protocol`` + llhttp (``httptools``) + the same client, uvloop
  (``floor_servers/protocol_floor.py``);
- ``floor-protocol-request``: the same protocol, each request made into aiohttp's request objects and
  answered by ``floor-aiohttp-direct``'s handler (``floor_servers/protocol_request_floor.py``): a lean edge
  that would keep aiohttp's requests for the router's handlers;
- ``floor-granian``: granian (Rust server, RSGI) + the same client (``floor_servers/granian_floor.py``),
  granian from the dev dependencies (``--granian-python`` picks another interpreter; ``--granian-python ""``
  leaves the row out);
- ``prefix-router``: ``serve --processes N --policy prefix`` as shipped (access log on), and with
  ``--set access_log=false``;
- ``sglang-router``: ``cache_aware``, from its own venv (``--peer-python``), as ``bench-overhead`` starts it;
  with ``--shim`` (``benchmarks/nodelay_shim.c`` built as ``peers.sh`` builds it) also
  ``sglang-router+nodelay``: the same with TCP_NODELAY set on its accepted connections (0.3.2 leaves
  Nagle on, which holds its streams' small writes back: see docs/benchmarks.md "Peers").

``--processes N`` runs every Python server with N processes on one port (prefix-router's ``serve
--processes``; each floor started N times with ``--reuse-port``; granian with N workers): the CPU per
request is then all of them together.

Rounds are interleaved: in each round, for every prompt size and concurrency, every target is measured
once (the order rotated by one each round), non-streamed then streamed. Printed per case: the best
round's req/s (streams/s), x sglang-router, the median latency added over the direct connection, the
server's CPU per request (``bench.overhead.cpu_seconds``: user + system of the process tree) and that CPU
as a share of sglang-router's; then the median over rounds of each target's ratio to sglang-router
measured in the same round (the steadiest figure on a shared machine). Then the routing core's own cost
per request cycle, in this process (``benchmarks/floor_core.py``), a slice after every round: routing
key, route, dispatched, first token, reply extension and finished, with ``--core-in-flight`` requests in
flight, at 1 and 16 workers; and the sum floor + core against sglang-router's CPU. The machine's
listen-backlog overflows during the rounds are printed too (a dropped SYN is a one-second stall that is
nobody's CPU).

    python benchmarks/floor.py --requests 3000 --rounds 3 --peer-python /tmp/i15-peers/bin/python \
        --shim /tmp/i17-nodelay-shim.so

``--targets``, ``--prompt-chars``, ``--concurrency`` and ``--kinds`` pick a subset (``direct`` is always
measured: it is the yardstick of added latency); ``--no-core`` skips the in-process part.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from prefix_router.lab.bench import loadgen
from prefix_router.lab.bench.overhead import (
    PEER_ENV,
    PEER_PYTHON,
    bodies,
    cpu_seconds,
    names,
    numbers,
    peer_argv,
    processes,
    router_argv,
    wait_listening,
)
from prefix_router.lab.launch.net import free_port
from prefix_router.node import loop_factory

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "floor_servers"))
import floor_common  # benchmarks/floor_servers/floor_common.py: the floors' commands
import floor_core  # benchmarks/floor_core.py, beside this file

DIRECT, SGLANG = "direct", "sglang-router"
TARGETS = (
    DIRECT, "floor-aiohttp", "floor-aiohttp-direct", "floor-protocol", "floor-protocol-request",
    "floor-granian", "prefix-router", "prefix-router-nolog", SGLANG, "sglang-router+nodelay",
)  # fmt: skip
LABELS = {
    "prefix-router": "prefix-router (as shipped)",
    "prefix-router-nolog": "prefix-router (access_log=false)",
    SGLANG: "sglang-router (cache_aware)",
    "sglang-router+nodelay": "sglang-router + TCP_NODELAY shim",
}
FLOORS = tuple(f"floor-{floor}" for floor in floor_common.FLOORS)
KINDS = ("plain", "stream")


@dataclass(frozen=True)
class Case:
    prompt_chars: int
    concurrency: int
    kind: str  # plain or stream


@dataclass
class Sample:
    """One throughput measurement of one target."""

    rate: float
    p50_s: float
    cpu_s: float  # server CPU seconds per request
    errors: int


@dataclass
class Target:
    name: str
    port: int
    pids: list[int]  # its processes (each counted with its descendants)


@dataclass
class Runs:
    samples: dict[Case, dict[str, list[Sample]]] = field(default_factory=dict)

    def add(self, case: Case, target: str, sample: Sample) -> None:
        self.samples.setdefault(case, {}).setdefault(target, []).append(sample)

    def best(self, case: Case, target: str) -> Sample:
        """The least disturbed round: highest rate, lowest p50 and CPU (each over all rounds)."""
        runs = self.samples[case][target]
        return Sample(
            max(s.rate for s in runs),
            min(s.p50_s for s in runs),
            min(s.cpu_s for s in runs),
            sum(s.errors for s in runs),
        )

    def paired(self, case: Case, target: str, metric: Callable[[Sample], float]) -> float:
        """The median over rounds of ``target``'s metric / sglang-router's, measured in the same round."""
        ours, theirs = self.samples[case][target], self.samples[case][SGLANG]
        return statistics.median(metric(a) / metric(b) for a, b in zip(ours, theirs, strict=True))


def spawn_targets(spawn: Callable[[list[str], dict[str, str] | None], int], args: argparse.Namespace,
                  console: Console) -> list[Target]:  # fmt: skip
    worker_port = free_port()
    upstream = f"http://127.0.0.1:{worker_port}"
    worker = [sys.executable, "-m", "prefix_router.lab.bench.instant_worker", "--port", str(worker_port)]
    targets = [Target(DIRECT, worker_port, [spawn([*worker, "--chunks", str(args.stream_chunks)], None)])]
    for name in args.targets:
        if name == DIRECT:
            continue
        if name == "floor-granian" and not args.granian_python:
            console.print("floor-granian: skipped (no --granian-python given)")
            continue
        if name == "sglang-router+nodelay" and not args.shim:
            continue  # asked for with --shim only
        port = free_port()
        argv, env = target_argv(name, args, worker_port, port, upstream)
        started = floor_common.copies(name.removeprefix("floor-"), args.processes) if name in FLOORS else 1
        targets.append(Target(name, port, [spawn(argv, env) for _ in range(started)]))
    return targets


def target_argv(
    name: str, args: argparse.Namespace, worker_port: int, port: int, upstream: str
) -> tuple[list[str], dict[str, str] | None]:
    if name in FLOORS:
        floor = name.removeprefix("floor-")
        return floor_common.floor_argv(floor, port, upstream, args.granian_python, args.processes)
    if name in ("prefix-router", "prefix-router-nolog"):
        argv = router_argv(worker_port, port, "uvloop", args.processes, "prefix")
        return [*argv, "--set", f"access_log={name == 'prefix-router'}"], None
    if name == SGLANG:
        return peer_argv(args.peer_python, worker_port, port), PEER_ENV
    if name == "sglang-router+nodelay":
        return peer_argv(args.peer_python, worker_port, port), {**PEER_ENV, "LD_PRELOAD": args.shim}
    raise ValueError(f"unknown target {name}")


async def measure(target: Target, sent: list[bytes], concurrency: int, tick: Callable[[], None]) -> Sample:
    cpu0 = sum(cpu_seconds(pid) for pid in target.pids)
    result = await loadgen.run(target.port, sent, concurrency, tick)
    cpu1 = sum(cpu_seconds(pid) for pid in target.pids)
    return Sample(result.rate, result.percentile(0.5), (cpu1 - cpu0) / len(sent), result.errors)


def cases_of(args: argparse.Namespace) -> list[Case]:
    return [Case(p, c, k) for p in args.prompt_chars for c in args.concurrency for k in args.kinds]


async def bench(
    args: argparse.Namespace, console: Console, core: list[floor_core.Setting]
) -> tuple[Runs, list[str]]:
    """The rounds; after each, a slice of the routing core's cycles (``core``), in this process while the
    servers idle, so that both parts see the machine in the same state."""
    cases = cases_of(args)
    with processes() as spawn:
        targets = spawn_targets(spawn, args, console)
        for target in targets:
            await wait_listening(target.port)
        made = {
            (p, k): bodies(args.requests if k == "plain" else args.streams, p, k == "stream")
            for p in args.prompt_chars
            for k in args.kinds
        }
        sent = {case: made[case.prompt_chars, case.kind] for case in cases}
        warm = bodies(max(1, args.requests // 4), cases[0].prompt_chars, False)
        for target in targets:  # unmeasured: connections, caches, the JIT-less interpreter's first paths
            await loadgen.run(target.port, warm, cases[0].concurrency)
        runs = Runs()
        overflows = listen_overflows()
        total = args.rounds * len(targets) * sum(len(b) for b in sent.values())
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("floor", total=total)
            for round_ in range(args.rounds):
                order = targets[round_ % len(targets) :] + targets[: round_ % len(targets)]
                for case in cases:
                    for target in order:
                        tick = lambda: progress.advance(task)  # noqa: E731
                        sample = await measure(target, sent[case], case.concurrency, tick)
                        runs.add(case, target.name, sample)
                floor_core.run_slice(core, max(1, args.core_cycles // args.rounds))
                console.print(f"round {round_ + 1}/{args.rounds} done (load average {load_average()})")
        console.print(
            f"listen backlog overflows on this machine during the rounds: {listen_overflows() - overflows} "
            "(each a SYN dropped and resent a second later; anyone's, not only this run's)"
        )
    return runs, [t.name for t in targets]


def listen_overflows() -> int:
    """This machine's count of connections refused for a full listen backlog (Linux; -1 elsewhere)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return -1
    for names_line, values in zip(lines[::2], lines[1::2], strict=False):
        if names_line.startswith("TcpExt:"):
            fields = dict(zip(names_line.split()[1:], values.split()[1:], strict=False))
            return int(fields.get("ListenOverflows", -1))
    return -1


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def ratio(a: float, b: float | None) -> str:
    return f"{a / b:.2f}" if b else "-"


def report(runs: Runs, measured: list[str], args: argparse.Namespace, console: Console) -> None:
    for case in runs.samples:
        unit = "req/s" if case.kind == "plain" else "streams/s"
        table = Table(
            title=f"{case.prompt_chars}-char chat prompts, concurrency {case.concurrency}, "
            f"{'non-streamed' if case.kind == 'plain' else 'streamed (8 SSE events)'}: best of {args.rounds}"
        )
        for column in ("target", unit, "x sglang", "x sglang (median round)", "p50 ms", "added p50 ms",
                       "CPU us/req", "CPU / sglang's", "errors"):  # fmt: skip
            table.add_column(column, justify="right", no_wrap=column == "target")
        direct = runs.best(case, DIRECT)
        peer = runs.best(case, SGLANG) if SGLANG in measured else None
        for name in measured:
            f = runs.best(case, name)
            paired = ratio(runs.paired(case, name, lambda s: s.rate), 1.0) if peer else "-"
            share = "-" if name == DIRECT or peer is None else f"{f.cpu_s / peer.cpu_s:.2f}"
            table.add_row(
                LABELS.get(name, name), f"{f.rate:,.0f}", ratio(f.rate, peer.rate if peer else None), paired,
                f"{f.p50_s * 1e3:.2f}", f"{(f.p50_s - direct.p50_s) * 1e3:.2f}", f"{f.cpu_s * 1e6:.0f}",
                share, str(f.errors),
            )  # fmt: skip
        console.print(table)
    console.print(
        "x sglang: throughput / sglang-router's (best rounds); median round: the median over rounds of the "
        "ratio measured in the same round. added p50: the median latency at that concurrency minus the "
        "direct connection's. CPU: the server's user+system CPU per request, all its processes and threads "
        "(direct: the worker's). Client, worker and servers share this machine's cores."
    )


def report_core(core: list[floor_core.CoreCost], runs: Runs, measured: list[str], console: Console) -> None:
    table = Table(title="the routing core's own cost per request cycle, in-process (us of CPU, mean)")
    for column in ("prompt chars", "workers", "JSON parse", *floor_core.STAGES, "core total",
                   "core p50 (wall)", "CPU/wall"):  # fmt: skip
        table.add_column(column, justify="right")
    for c in core:
        stages = [f"{c.mean_us[s]:.1f}" for s in floor_core.STAGES]
        table.add_row(
            f"{c.prompt_chars:,}", str(c.workers), f"{c.mean_us['parse']:.1f}", *stages,
            f"{c.total_us:.1f}", f"{c.p50_us:.1f}", f"{c.cpu_share:.2f}",
        )  # fmt: skip
    console.print(table)
    if SGLANG not in measured:
        return
    floors = [n for n in measured if n in FLOORS]
    synth = Table(title="floor + routing core (+ JSON parse) vs sglang-router's CPU, us per request")
    for column in ("prompt", "conc.", "kind", "best floor", "floor CPU", "core 1 w", "core 16 w",
                   "floor + parse + core (1 w / 16 w)", "sglang CPU", "(floor+parse+core) / sglang",
                   "prefix-router CPU"):  # fmt: skip
        synth.add_column(column, justify="right")
    for case in runs.samples:
        best_floor = min(floors, key=lambda n: runs.best(case, n).cpu_s)
        floor_us = runs.best(case, best_floor).cpu_s * 1e6
        found = {c.workers: c for c in core if c.prompt_chars == case.prompt_chars}
        if 1 not in found or 16 not in found:
            continue
        one, sixteen = found[1], found[16]
        sums = [floor_us + c.mean_us["parse"] + c.total_us for c in (one, sixteen)]
        sg = runs.best(case, SGLANG).cpu_s * 1e6
        ours = runs.best(case, "prefix-router").cpu_s * 1e6 if "prefix-router" in measured else float("nan")
        synth.add_row(
            f"{case.prompt_chars:,}", str(case.concurrency), case.kind, best_floor, f"{floor_us:.0f}",
            f"{one.total_us:.0f}", f"{sixteen.total_us:.0f}", f"{sums[0]:.0f} / {sums[1]:.0f}",
            f"{sg:.0f}", f"{sums[0] / sg:.2f} / {sums[1] / sg:.2f}", f"{ours:.0f}",
        )  # fmt: skip
    console.print(synth)
    console.print(
        "core: the routing core's calls timed in one process that runs nothing else, scaled to its CPU "
        "time (CPU/wall); JSON parse: orjson.loads of the request body, which a floor never does and a "
        "router must. The sum is a lower bound of a Python router on the best floor: it leaves out the "
        "access log, metrics, SSE accounting, timeouts and the pool."
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=3000, help="non-streamed requests per measurement")
    p.add_argument("--streams", type=int, default=0, help="streams per measurement (default requests/2)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-chars", default="2000,32000")
    p.add_argument("--concurrency", default="32,256")
    p.add_argument("--kinds", default="plain,stream", help="plain,stream")
    p.add_argument("--stream-chunks", type=int, default=8)
    p.add_argument("--processes", type=int, default=1, help="processes of each Python server (see above)")
    p.add_argument("--targets", default=",".join(TARGETS), help=f"a subset of {','.join(TARGETS)}")
    p.add_argument("--peer-python", default=PEER_PYTHON, help="the Python of sglang-router's own venv")
    p.add_argument(
        "--granian-python", default=sys.executable, help="a Python with granian (dev extra); '' = no row"
    )
    p.add_argument("--shim", default="", help="built benchmarks/nodelay_shim.c: adds sglang-router+nodelay")
    p.add_argument("--core-workers", default="1,16", help="routing-core cost at these worker counts")
    p.add_argument("--core-cycles", type=int, default=3000, help="cycles timed per core setting, all rounds")
    p.add_argument("--core-in-flight", type=int, default=32, help="requests in flight during the cycles")
    p.add_argument("--no-core", action="store_true", help="skip the routing-core measurement")
    args = p.parse_args()
    args.prompt_chars, args.concurrency = numbers(args.prompt_chars), numbers(args.concurrency)
    args.kinds, args.targets = names(args.kinds), names(args.targets)
    args.streams = args.streams or max(1, args.requests // 2)
    unknown = set(args.targets) - set(TARGETS) or set(args.kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown: {', '.join(sorted(unknown))}")
    if DIRECT not in args.targets:
        args.targets.insert(0, DIRECT)  # the yardstick of added latency
    if SGLANG in args.targets and not Path(args.peer_python).exists():
        p.error(f"sglang-router needs its own venv (benchmarks/peers.sh): {args.peer_python} not found")
    return args


def main() -> int:
    args = parse_args()
    console = Console(width=170, force_terminal=False)
    console.print(
        f"floor benchmark: {os.cpu_count()} CPUs, load average {load_average()}, {args.requests} requests / "
        f"{args.streams} streams per measurement, {args.rounds} rounds; "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    )
    core = [] if args.no_core else floor_core.settings_for(
        args.prompt_chars, numbers(args.core_workers), args.core_cycles, args.core_in_flight
    )  # fmt: skip
    loop = loop_factory("uvloop")()
    try:
        runs, measured = loop.run_until_complete(bench(args, console, core))
    finally:
        loop.close()
    report(runs, measured, args, console)
    if core:
        report_core([setting.cost() for setting in core], runs, measured, console)
    console.print(f"done, load average {load_average()}")
    errors = sum(s.errors for per in runs.samples.values() for runs_ in per.values() for s in runs_)
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
