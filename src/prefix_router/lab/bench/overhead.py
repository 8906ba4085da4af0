"""``prefix-router bench-overhead``: what the router adds next to an engine that answers at once.

One run starts an instant worker, prefix-router once per ``--processes`` value (and ``--loops`` event
loop), and optionally a peer router (``--peer sglang-router``, from its own virtual environment), each
as separate processes. Then, for every prompt size and concurrency asked for, round after round and side
by side with a direct connection to the worker, it measures non-streamed throughput, streams per second,
the median latency at that concurrency (and what each router adds to the direct one's), and each server's
CPU per request. Ratios are to the direct connection and to the peer. ``--profile`` also records the
routers with py-spy and prints where their CPU goes, stage by stage (``bench.profile``). The routers
write their access log, as shipped; ``--access-log on,off`` adds routers without it, to measure it.
``--builds pure,compiled`` runs each router configuration on both builds side by side: the pure package
and the compiled routing core (``setup.py`` with ``COMPILE_ROUTING_CORE=1``; ``scripts/build-compiled.sh``
prints its directory), put first on the router's ``PYTHONPATH`` from ``--compiled-lib``. A third build,
``before``, is another compiled package (``--before-lib``: an older commit's, built by its own
``scripts/build-compiled.sh``), for a change measured before and after in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from prefix_router.lab.bench import loadgen, profile
from prefix_router.lab.launch.fleet import signal_group
from prefix_router.lab.launch.net import free_port
from prefix_router.node import loop_factory
from prefix_router.proxy import parent_death_signal

PEERS = ("sglang-router",)
PEER_PYTHON = os.environ.get("PREFIX_ROUTER_PEERS_VENV", "/tmp/peers") + "/bin/python"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench-overhead", help="measure the router's added latency and throughput vs direct")
    p.add_argument("--requests", type=int, default=10_000, help="requests per throughput measurement")
    p.add_argument("--concurrency", default="32", help="client connections, comma-separated (32,256)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best round is reported")
    p.add_argument("--prompt-chars", default="2000", help="chat prompt sizes, comma-separated (2000,32000)")
    p.add_argument("--stream-chunks", type=int, default=8, help="SSE events per streamed answer")
    p.add_argument("--loops", default="uvloop", help="router event loops to compare (uvloop,asyncio)")
    p.add_argument("--processes", default="1", help="prefix-router serving processes to compare (1,2)")
    p.add_argument("--policy", default="prefix", help="prefix-router's routing policy")
    p.add_argument("--peer", choices=PEERS, help="also measure this router (cache_aware), installed apart")
    p.add_argument("--peer-python", default=PEER_PYTHON, help="the Python of the peer's own venv")
    p.add_argument("--profile", action="store_true", help="py-spy the routers: CPU per request by stage")
    p.add_argument("--access-log", default="on", help="router access log settings to compare (on,off)")
    p.add_argument("--http-servers", default="lean", help="router http_server settings (lean,aiohttp)")
    p.add_argument("--builds", default="pure", help="prefix-router builds to compare (pure,compiled,before)")
    p.add_argument(
        "--compiled-lib",
        default=os.environ.get("COMPILED_ROUTING_CORE_LIB", ""),
        help="the compiled build's package directory (scripts/build-compiled.sh prints it)",
    )
    p.add_argument("--before-lib", default="", help="the 'before' build's package directory (a compiled one)")
    p.set_defaults(func=run_bench)


@dataclass
class Figures:
    rps: float = 0.0
    sps: float = 0.0
    p50_s: float = float("inf")  # non-streamed, at the measured concurrency
    stream_p50_s: float = float("inf")
    cpu_plain_s: float = float("inf")  # server CPU seconds per non-streaming request
    cpu_stream_s: float = float("inf")
    # times the server's threads were preempted (involuntary context switches) per non-streaming request
    preempted: float = float("inf")
    errors: int = 0

    def merge(self, other: Figures) -> None:
        """Keep the best of rounds (least disturbed by the rest of the machine)."""
        self.rps, self.sps = max(self.rps, other.rps), max(self.sps, other.sps)
        self.p50_s, self.stream_p50_s = (
            min(self.p50_s, other.p50_s),
            min(self.stream_p50_s, other.stream_p50_s),
        )
        self.cpu_plain_s = min(self.cpu_plain_s, other.cpu_plain_s)
        self.cpu_stream_s = min(self.cpu_stream_s, other.cpu_stream_s)
        self.preempted = min(self.preempted, other.preempted)
        self.errors += other.errors


@dataclass(frozen=True)
class Case:
    prompt_chars: int
    concurrency: int


@dataclass
class Target:
    name: str
    port: int
    pid: int
    ours: bool


@dataclass
class Plan:
    requests: int
    stream_chunks: int
    targets: list[Target] = field(default_factory=list)


def bodies(n: int, prompt_chars: int, stream: bool) -> list[bytes]:
    system = ("You are a helpful assistant for a benchmark. " * (prompt_chars // 45 + 1))[:prompt_chars]
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"question {i}"}]
        body = orjson.dumps({"model": "instant", "messages": messages, "max_tokens": 8, "stream": stream})
        out.append(loadgen.request_bytes("/v1/chat/completions", body))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its descendants (Linux ``/proc``; NaN elsewhere)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and all its descendants (NaN elsewhere than Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan"), float("nan")
    tick = os.sysconf("SC_CLK_TCK")
    user, system = int(fields[11]) / tick, int(fields[12]) / tick
    for child in children(pid):
        child_user, child_system = cpu_split(child)
        user, system = user + child_user, system + child_system
    return user, system


def preemptions(pid: int) -> int:
    """How often the scheduler took a core from the threads of a process and all its descendants while
    they had work (their involuntary context switches; Linux ``/proc``, 0 elsewhere)."""
    return context_switches(pid, "nonvoluntary")


def context_switches(pid: int, kind: str) -> int:
    """``kind`` (``voluntary``: waiting for work, ``nonvoluntary``: preempted) context switches of every
    thread of a process and all its descendants (Linux ``/proc``; 0 elsewhere)."""
    total, field = 0, f"{kind}_ctxt_switches:"
    for task in threads(pid):
        with contextlib.suppress(OSError):  # a thread that ended since
            for line in (task / "status").read_text().splitlines():
                if line.startswith(field):
                    total += int(line.split()[1])
    return total


def threads(pid: int) -> list[Path]:
    """The ``/proc`` task folders of every thread of a process and all its descendants (Linux; none
    elsewhere)."""
    found: list[Path] = []
    with contextlib.suppress(OSError):
        found += Path(f"/proc/{pid}/task").iterdir()
    for child in children(pid):
        found += threads(child)
    return found


def children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


@contextlib.contextmanager
def processes() -> Iterator[Callable[[list[str], dict[str, str] | None], int]]:
    """Spawn helper processes (stderr discarded: a failure shows as a port that never answers), each in its
    own process group, stopped as a group at the end (a server's workers too: SIGTERM, SIGKILL after 10 s).
    Should this process die without reaching the end (SIGKILL), each helper gets SIGTERM from the kernel
    (``parent_death_signal``; spawn from the main thread)."""
    procs: list[subprocess.Popen[bytes]] = []
    tied = parent_death_signal()

    def spawn(argv: list[str], env: dict[str, str] | None = None) -> int:
        procs.append(
            subprocess.Popen(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                preexec_fn=tied,  # only a prctl call in the child: libc was loaded before the fork
            )
        )
        return procs[-1].pid

    try:
        yield spawn
    finally:
        for proc in procs:
            signal_group(proc, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            signal_group(proc, signal.SIGKILL)  # workers that outlived their server


async def wait_listening(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = await loadgen.run(port, bodies(1, 100, False), 1)
            if not result.errors:
                return
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing answered on port {port}")


async def measure(target: Target, case: Case, plan: Plan, tick: Callable[[], None]) -> Figures:
    plain_bodies = bodies(plan.requests, case.prompt_chars, False)
    stream_bodies = bodies(max(1, plan.requests // 2), case.prompt_chars, True)
    cpu0, preempted0 = cpu_seconds(target.pid), preemptions(target.pid)
    plain = await loadgen.run(target.port, plain_bodies, case.concurrency, tick)
    cpu1, preempted1 = cpu_seconds(target.pid), preemptions(target.pid)
    streams = await loadgen.run(target.port, stream_bodies, case.concurrency, tick)
    cpu2 = cpu_seconds(target.pid)
    return Figures(
        rps=plain.rate,
        sps=streams.rate,
        p50_s=plain.percentile(0.5),
        stream_p50_s=streams.percentile(0.5),
        cpu_plain_s=(cpu1 - cpu0) / len(plain_bodies),
        cpu_stream_s=(cpu2 - cpu1) / len(stream_bodies),
        preempted=(preempted1 - preempted0) / len(plain_bodies),
        errors=plain.errors + streams.errors,
    )


def names(csv: str) -> list[str]:
    return [name.strip() for name in csv.split(",") if name.strip()]


def numbers(csv: str) -> list[int]:
    return [int(n) for n in names(csv)]


def router_argv(worker_port: int, port: int, loop: str, processes: int, policy: str = "prefix") -> list[str]:
    return [
        sys.executable, "-m", "prefix_router.proxy", "serve",
        "--worker", f"http://127.0.0.1:{worker_port}",
        "--port", str(port),
        "--processes", str(processes),
        "--policy", policy,
        "--set", f"event_loop={loop}",
        "--set", "log_level=warning",
    ]  # fmt: skip


def peer_argv(python: str, worker_port: int, port: int) -> list[str]:
    """sglang-router's cache_aware policy on loopback (router and its metrics), quiet."""
    return [
        python, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", f"http://127.0.0.1:{worker_port}",
        "--policy", "cache_aware",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--log-level", "warn",
    ]  # fmt: skip


def build_env(build: str, compiled_lib: str, before_lib: str = "") -> dict[str, str] | None:
    """The router's environment for a build: a compiled package (``compiled``: ``compiled_lib``,
    ``before``: ``before_lib``) first on its path, or as installed (``pure``)."""
    if build == "pure":
        return None
    if build not in ("compiled", "before"):
        raise ValueError(f"unknown build {build!r} (pure, compiled, before)")
    lib = compiled_lib if build == "compiled" else before_lib
    return {"PYTHONPATH": os.pathsep.join(p for p in (lib, os.environ.get("PYTHONPATH")) if p)}


def compiled_missing(compiled_lib: str, flag: str = "--compiled-lib") -> str | None:
    """Why ``compiled_lib`` is not a compiled build (its routing index an extension module), or None."""
    if not compiled_lib:
        return f"this build needs {flag} DIR (scripts/build-compiled.sh prints it)"
    probe = "import prefix_router.routing.index as i; print(i.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, **(build_env("compiled", compiled_lib) or {})},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = out.stdout.strip()
    if out.returncode or not found.startswith(compiled_lib) or found.endswith(".py"):
        return f"{compiled_lib} holds no compiled routing core ({found or out.stderr.strip()[-200:]})"
    return None


PEER_ENV = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}  # never a model hub


async def bench(args: argparse.Namespace, console: Console) -> dict[Case, dict[str, Figures]]:
    worker_port = free_port()
    plan = Plan(args.requests, args.stream_chunks)
    cases = [Case(p, c) for p in numbers(args.prompt_chars) for c in numbers(args.concurrency)]
    with processes() as spawn:
        worker = [sys.executable, "-m", "prefix_router.lab.bench.instant_worker", "--port", str(worker_port)]
        pid = spawn([*worker, "--chunks", str(args.stream_chunks)], None)
        plan.targets.append(Target("direct", worker_port, pid, False))
        for loop in names(args.loops):
            for count in numbers(args.processes):
                for access, server in itertools.product(names(args.access_log), names(args.http_servers)):
                    for build in names(args.builds):
                        port = free_port()
                        argv = [*router_argv(worker_port, port, loop, count, args.policy)]
                        argv += ["--set", f"access_log={access == 'on'}", "--set", f"http_server={server}"]
                        pid = spawn(argv, build_env(build, args.compiled_lib, args.before_lib))
                        suffix = "" if access == "on" else ", no access log"
                        suffix += f", {server}" if len(names(args.http_servers)) > 1 else ""
                        suffix += f", {build}" if build != "pure" or len(names(args.builds)) > 1 else ""
                        plan.targets.append(
                            Target(f"prefix-router ({count} proc, {loop}{suffix})", port, pid, True)
                        )
        if args.peer:
            port = free_port()
            pid = spawn(peer_argv(args.peer_python, worker_port, port), PEER_ENV)
            plan.targets.append(Target(f"{args.peer} (cache_aware)", port, pid, False))
        for target in plan.targets:
            await wait_listening(target.port)
        results = await rounds(plan, cases, args.rounds, console)
        if args.profile:
            report_profiles(await profiles(plan, cases[0]), console)
        return results


async def rounds(plan: Plan, cases: list[Case], n: int, console: Console) -> dict[Case, dict[str, Figures]]:
    results = {case: {t.name: Figures() for t in plan.targets} for case in cases}
    per_target = plan.requests + max(1, plan.requests // 2)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("bench-overhead", total=n * len(cases) * len(plan.targets) * per_target)

        def tick() -> None:
            progress.advance(task)

        for _ in range(n):
            for case in cases:
                for target in plan.targets:
                    results[case][target.name].merge(await measure(target, case, plan, tick))
    return results


Cpu = tuple[float, float]  # user, system CPU seconds per request
Profile = tuple[Counter[str], Cpu, Counter[str], Cpu]  # plain samples and CPU, stream ones


async def profiles(plan: Plan, case: Case) -> dict[str, Profile]:
    """Per router of ours: (plain samples, CPU/request, stream samples, CPU/stream), with py-spy."""
    exe = profile.py_spy()
    if exe is None:
        raise RuntimeError("--profile needs py-spy (pip install py-spy, in the dev extra)")
    out: dict[str, Profile] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for target in (t for t in plan.targets if t.ours):
            found: list[tuple[Counter[str], Cpu]] = []
            for stream in (False, True):
                recordings = [
                    profile.Recording(exe, pid, Path(tmp) / f"{pid}-{stream}.txt")
                    for pid in [target.pid, *children(target.pid)]
                ]
                await asyncio.sleep(0.5)
                figures = await measure_one(target, case, plan, stream)
                samples: Counter[str] = Counter()
                for recording in recordings:
                    samples.update(recording.stop())
                found.append((samples, figures))
            out[target.name] = (*found[0], *found[1])
    return out


async def measure_one(target: Target, case: Case, plan: Plan, stream: bool) -> Cpu:
    """(user, system) CPU seconds per request of one throughput run."""
    sent = bodies(plan.requests, case.prompt_chars, stream)
    user0, system0 = cpu_split(target.pid)
    await loadgen.run(target.port, sent, case.concurrency)
    user1, system1 = cpu_split(target.pid)
    return (user1 - user0) / len(sent), (system1 - system0) / len(sent)


COLUMNS = (
    "target", "req/s", "x direct", "x peer", "p50 ms", "added p50 ms", "streams/s", "x peer", "stream p50 ms",
    "added p50 ms", "CPU us/req", "x peer", "preempted /req", "CPU us/stream", "x peer", "errors",
)  # fmt: skip


def row(name: str, f: Figures, direct: Figures, peer: Figures | None) -> list[str]:
    def ratio(ours: float, theirs: float | None) -> str:
        return f"{ours / theirs:.2f}" if theirs else "-"

    return [
        name, f"{f.rps:,.0f}", ratio(f.rps, direct.rps), ratio(f.rps, peer.rps if peer else None),
        f"{f.p50_s * 1e3:.2f}", f"{(f.p50_s - direct.p50_s) * 1e3:.2f}",
        f"{f.sps:,.0f}", ratio(f.sps, peer.sps if peer else None),
        f"{f.stream_p50_s * 1e3:.2f}", f"{(f.stream_p50_s - direct.stream_p50_s) * 1e3:.2f}",
        f"{f.cpu_plain_s * 1e6:.0f}", ratio(f.cpu_plain_s, peer.cpu_plain_s if peer else None),
        f"{f.preempted:.2f}",
        f"{f.cpu_stream_s * 1e6:.0f}", ratio(f.cpu_stream_s, peer.cpu_stream_s if peer else None),
        str(f.errors),
    ]  # fmt: skip


def report(results: dict[Case, dict[str, Figures]], args: argparse.Namespace, console: Console) -> None:
    for case, figures in results.items():
        table = Table(
            title=f"bench-overhead: instant worker, {case.prompt_chars}-char chat prompts, concurrency "
            f"{case.concurrency}, {os.cpu_count()} CPUs, best of {args.rounds} rounds"
        )
        for column in COLUMNS:
            table.add_column(column, justify="right", no_wrap=column == "target")
        peer = next((f for name, f in figures.items() if args.peer and name.startswith(args.peer)), None)
        for name, f in figures.items():
            table.add_row(*row(name, f, figures["direct"], peer))
        console.print(table)
    console.print(
        "x peer: throughput (CPU) relative to the peer router's in the same run. CPU: the server's CPU "
        "time per request, all its processes and threads (the worker's for direct). preempted: how often "
        "per request the scheduler took a core from the server's threads while they had work. Load "
        "generator, worker and routers share this machine's cores, so req/s also depends on whatever else "
        "runs on it."
    )


def report_profiles(found: dict[str, Profile], console: Console) -> None:
    table = Table(title="where the router's CPU goes: us per request by stage (py-spy samples)")
    table.add_column("stage")
    for name in found:
        table.add_column(f"{name} plain", justify="right")
        table.add_column(f"{name} stream", justify="right")
    rows: dict[str, list[str]] = {stage: [] for stage in (*profile.STAGES, "total")}
    for plain, plain_cpu, stream, stream_cpu in found.values():
        for samples, cpu in ((plain, plain_cpu), (stream, stream_cpu)):
            stages = profile.per_request(samples, *cpu)
            for stage in profile.STAGES:
                rows[stage].append(f"{stages.get(stage, 0.0):.0f}")
            rows["total"].append(f"{sum(cpu) * 1e6:.0f}")
    for stage, cells in rows.items():
        table.add_row(stage, *cells)
    console.print(table)


def run_bench(args: argparse.Namespace) -> int:
    console = Console(width=max(150, Console().width))
    if args.peer and not Path(args.peer_python).exists():
        console.print(
            f"--peer needs {args.peer} in its own venv: see benchmarks/peers.sh ({args.peer_python})"
        )
        return 2
    for build, lib, flag in (
        ("compiled", args.compiled_lib, "--compiled-lib"),
        ("before", args.before_lib, "--before-lib"),
    ):
        if build in names(args.builds) and (why := compiled_missing(lib, flag)):
            console.print(why)
            return 2
    loop = loop_factory("uvloop")()
    try:
        results = loop.run_until_complete(bench(args, console))
    finally:
        loop.close()
    report(results, args, console)
    return 0 if all(f.errors == 0 for figures in results.values() for f in figures.values()) else 1
