"""What a second serving process costs, taken apart (issue 26): prefix-router with one process, with two
(``serve --processes 2``), and with two that share nothing; sglang-router with its worker threads (one per
core) and pinned to one core (``taskset -c 0``: one thread at work). One instant worker, the load
generator in this process, each target on its own port, measured in turn, ``--rounds`` times.

Printed per target and prompt size, for the round with the least CPU: requests per second, the server's
CPU per non-streamed request (user and system, all its processes and threads), how often per request
its threads were preempted (the scheduler took their core while they had work) and how often they
waited for work (voluntary context switches). "Two that share nothing" is ``serve --processes 2`` with
the local channel left out (``processes.install_local_replication`` replaced by a no-op in the served
interpreter, inherited by its forked processes): the processes then route on their own views. It is a
measuring instrument, not a configuration: the difference to ``serve --processes 2`` is what sharing the
view costs, the difference to one process what the second process costs beyond it.

    python benchmarks/processes_cost.py --compiled-lib "$(scripts/build-compiled.sh)" \\
        --peer-python /tmp/peers/bin/python --prompt-chars 2000,32000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter

from prefix_router.lab.bench import loadgen
from prefix_router.lab.bench.overhead import (
    PEER_ENV,
    PEER_PYTHON,
    bodies,
    build_env,
    context_switches,
    cpu_split,
    numbers,
    peer_argv,
    preemptions,
    processes,
    router_argv,
    wait_listening,
)
from prefix_router.lab.bench.preemption import SERVER, SwitchTrace, preemptors, server_threads
from prefix_router.lab.launch.net import free_port

# ``serve`` in an interpreter where the processes' local channel is a no-op (``--processes`` forks it)
UNSHARED = (
    "import sys; from prefix_router.proxy.run import processes; "
    "processes.install_local_replication = lambda *args, **kwargs: None; "
    "from prefix_router.proxy.__main__ import main; sys.exit(main())"
)
Figures = tuple[float, float, float, float, float]  # req/s, user s, system s, preempted, waited per request
TAKERS = ("load generator", "worker")  # named in the trace table; the server's own and others follow


def targets(worker_port: int, args: argparse.Namespace) -> list[tuple[str, list[str], dict[str, str] | None]]:
    env = build_env("compiled" if args.compiled_lib else "pure", args.compiled_lib)
    one, two = router_argv(worker_port, 0, "uvloop", 1), router_argv(worker_port, 0, "uvloop", 2)
    unshared = [sys.executable, "-c", UNSHARED, *two[3:]]  # two[:3]: python -m prefix_router.proxy
    out = [("prefix-router, 1 process", one, env), ("prefix-router, 2 processes", two, env),
           ("prefix-router, 2 processes sharing nothing", unshared, env)]  # fmt: skip
    if args.peer_python:
        peer = peer_argv(args.peer_python, worker_port, 0)
        out += [("sglang-router, its worker threads", peer, PEER_ENV),
                ("sglang-router, pinned to one core", ["taskset", "-c", "0", *peer], PEER_ENV)]  # fmt: skip
    return out


async def measure(
    port: int, pid: int, chars: int, args: argparse.Namespace, takers: dict[int, str] | None = None
) -> tuple[Figures, Counter[str]]:
    """The figures of one measured run, and who preempted the server's threads in it (``takers`` names
    the known pids; None: not traced)."""
    await loadgen.run(port, bodies(args.warm, chars, False), args.concurrency)
    sent = bodies(args.requests, chars, False)
    trace = SwitchTrace() if takers is not None else None
    user0, system0 = cpu_split(pid)
    preempted0, waited0 = preemptions(pid), context_switches(pid, "voluntary")
    with trace or contextlib.nullcontext():
        result = await loadgen.run(port, sent, args.concurrency)
    user1, system1 = cpu_split(pid)
    if result.errors:
        raise RuntimeError(f"{result.errors} errors on port {port}")
    n = len(sent)
    figures = (result.rate, (user1 - user0) / n, (system1 - system0) / n, (preemptions(pid) - preempted0) / n,
               (context_switches(pid, "voluntary") - waited0) / n)  # fmt: skip
    if trace is None or takers is None:
        return figures, Counter()
    try:
        return figures, preemptors(trace.lines(), server_threads(pid), takers)
    finally:
        trace.close()


def run_target(
    argv: list[str],
    env: dict[str, str] | None,
    sizes: list[int],
    args: argparse.Namespace,
    takers: dict[int, str] | None,
) -> dict[int, tuple[Figures, Counter[str]]]:
    port = free_port()
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        asyncio.run(wait_listening(port, 60))
        return {chars: asyncio.run(measure(port, proc.pid, chars, args, takers)) for chars in sizes}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-chars", default="2000,32000")
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--warm", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compiled-lib", default="", help="the compiled build ('' for the pure one)")
    p.add_argument("--peer-python", default=PEER_PYTHON, help="sglang-router's venv ('' to leave it out)")
    p.add_argument("--trace-preemptions", action="store_true", help="who took the server's cores (perf)")
    args = p.parse_args()
    sizes = numbers(args.prompt_chars)
    best: dict[tuple[str, int], tuple[Figures, Counter[str]]] = {}
    with processes() as spawn:
        worker_port = free_port()
        worker = spawn(
            [sys.executable, "-m", "prefix_router.lab.bench.instant_worker", "--port", str(worker_port)], None
        )
        asyncio.run(wait_listening(worker_port))
        takers = dict(zip((os.getpid(), worker), TAKERS, strict=True)) if args.trace_preemptions else None
        for round_ in range(args.rounds):
            for label, argv, env in targets(worker_port, args):
                for chars, measured in run_target(argv, env, sizes, args, takers).items():
                    kept = best.get((label, chars))
                    if kept is None or sum(measured[0][1:3]) < sum(kept[0][1:3]):
                        best[(label, chars)] = measured
            print(f"round {round_ + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    print(f"{args.requests} non-streamed requests at concurrency {args.concurrency}, the round with the "
          f"least CPU of {args.rounds}, {os.cpu_count()} CPUs")  # fmt: skip
    print("| target | prompt | req/s | CPU us/req (user + system) | preempted /req | waited /req |")
    print("|---|---:|---:|---:|---:|---:|")
    for (label, chars), ((rate, user, system, preempted, waited), _) in best.items():
        cpu = f"{(user + system) * 1e6:.0f} ({user * 1e6:.0f} + {system * 1e6:.0f})"
        print(f"| {label} | {chars:,} | {rate:,.0f} | {cpu} | {preempted:.2f} | {waited:.2f} |")
    if args.trace_preemptions:
        print_takers(best, args.requests)


def print_takers(best: dict[tuple[str, int], tuple[Figures, Counter[str]]], requests: int) -> None:
    """Who took the server's cores, per request, in the runs kept above (traced: perf's own share is
    among the others)."""
    print("\nwho preempted the server's threads, per request (traced runs)")
    print(f"| target | prompt | {' | '.join(TAKERS)} | {SERVER} | others |")
    print("|---|---:|" + "---:|" * (len(TAKERS) + 2))
    for (label, chars), (_, takers) in best.items():
        named = [takers[name] / requests for name in (*TAKERS, SERVER)]
        others = (sum(takers.values()) - sum(takers[name] for name in (*TAKERS, SERVER))) / requests
        print(f"| {label} | {chars:,} | " + " | ".join(f"{v:.2f}" for v in (*named, others)) + " |")


if __name__ == "__main__":
    main()
