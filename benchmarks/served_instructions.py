"""Instructions per served request: prefix-router's builds and sglang-router, each serving the instant
worker under Valgrind's callgrind (issue 26), the measure of ``bench-overhead``'s "CPU per request"
that the machine's noise does not move.

Each target is started twice under callgrind (every process it starts included), sent ``--warm``
requests and then ``--requests`` or twice that (``bench-overhead``'s non-streamed requests at
``--concurrency``), and stopped (SIGTERM); the run with fewer requests is kept running as long as the
other took, so that what the processes do on timers (probes, sharing their view) counts alike in both.
The difference of the two runs' counts over ``--requests`` is one request's instructions, start-up,
warm-up, timers and shutdown left out. What it counts is the user-space
work of the router's processes (their event loops, HTTP servers and clients, routing); the kernel's work
for their sockets is not counted, and a cache miss counts as one instruction: the timed benchmarks stay
the measure of time, this one of the work done.

    python benchmarks/served_instructions.py --builds before,compiled \\
        --compiled-lib "$(scripts/build-compiled.sh)" --before-lib OTHER_BUILD \\
        --peer-python /tmp/peers/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prefix_router.lab.bench import loadgen
from prefix_router.lab.bench.overhead import (
    PEER_ENV,
    PEER_PYTHON,
    bodies,
    build_env,
    names,
    numbers,
    peer_argv,
    processes,
    router_argv,
    wait_listening,
)
from prefix_router.lab.launch.net import free_port

_TOTALS = re.compile(r"^(?:summary|totals):\s*(\d+)", re.MULTILINE)
STARTUP_S = 600.0  # a router starting under callgrind: imports and all, at about a fiftieth of its speed


def counted_run(argv: list[str], env: dict[str, str] | None, sent: list[bytes], warm: list[bytes],
                concurrency: int, lasting_s: float = 0.0) -> tuple[int, float]:  # fmt: skip
    """Instructions of every process of one run (started under callgrind, warmed, sent ``sent``, kept
    running until ``lasting_s`` after the first of ``sent``, stopped) and the seconds ``sent`` took."""
    with tempfile.TemporaryDirectory() as out:
        valgrind = [
            "valgrind",
            "--tool=callgrind",
            "--trace-children=yes",
            f"--callgrind-out-file={out}/cg.%p",
        ]
        took = run_once(valgrind + argv, env, sent, warm, concurrency, lasting_s)
        return sum(totals(path) for path in Path(out).glob("cg.*")), took


def run_once(argv: list[str], env: dict[str, str] | None, sent: list[bytes], warm: list[bytes],
             concurrency: int, lasting_s: float = 0.0) -> float:  # fmt: skip
    """Start ``argv`` on a port of its own, send it ``warm`` then ``sent`` (and wait until ``lasting_s``
    after the first of ``sent``), stop it (SIGTERM), wait; the seconds ``sent`` took."""
    port = free_port()
    child_env = {**os.environ, **(env or {})}
    child_env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled once (``prime``), not at every start
    proc = subprocess.Popen(with_port(argv, port), env=child_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        return asyncio.run(drive(port, sent, warm, concurrency, lasting_s))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(STARTUP_S)


def with_port(argv: list[str], port: int) -> list[str]:
    """``argv`` with its ``--port`` value replaced by ``port``."""
    out = list(argv)
    out[out.index("--port") + 1] = str(port)
    return out


async def drive(port: int, sent: list[bytes], warm: list[bytes], concurrency: int, lasting_s: float) -> float:
    await wait_listening(port, STARTUP_S)
    await send(port, warm, concurrency)
    start = time.monotonic()
    await send(port, sent, concurrency)
    took = time.monotonic() - start
    await asyncio.sleep(max(0.0, lasting_s - took))
    return took


async def send(port: int, batch: list[bytes], concurrency: int) -> None:
    if batch:
        result = await loadgen.run(port, batch, concurrency)
        if result.errors:
            raise RuntimeError(f"{result.errors} errors from the router on port {port}")


def totals(path: Path) -> int:
    found = _TOTALS.search(path.read_text(errors="replace"))
    return int(found.group(1)) if found else 0


def per_request(argv: list[str], env: dict[str, str] | None, args: argparse.Namespace, chars: int) -> float:
    """Thousands of instructions per served request."""
    n = args.requests
    warm = bodies(args.warm, chars, False)
    run_once(argv, env, [], warm, args.concurrency)  # not counted: writes the bytecode both runs then load
    high, took = counted_run(argv, env, bodies(2 * n, chars, False), warm, args.concurrency)
    # the N-request run lasts as long as the 2N one: what the processes do on timers cancels out
    low, _ = counted_run(argv, env, bodies(n, chars, False), warm, args.concurrency, lasting_s=took)
    return (high - low) / n / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-chars", default="2000,32000")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--warm", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--processes", default="1", help="prefix-router serving processes (1,2)")
    p.add_argument("--builds", default="compiled", help="prefix-router builds (pure,before,compiled)")
    p.add_argument("--http-servers", default="lean", help="prefix-router's http_server (lean,aiohttp)")
    p.add_argument("--compiled-lib", default="")
    p.add_argument("--before-lib", default="")
    p.add_argument("--peer-python", default=PEER_PYTHON, help="sglang-router's venv ('' to leave it out)")
    args = p.parse_args()
    worker_port = free_port()
    sizes = numbers(args.prompt_chars)
    with processes() as spawn:  # the worker, outside Valgrind
        spawn(
            [sys.executable, "-m", "prefix_router.lab.bench.instant_worker", "--port", str(worker_port)], None
        )
        asyncio.run(wait_listening(worker_port))
        targets = [
            (f"prefix-router ({n} proc, {server}, {build})",
             [*router_argv(worker_port, 0, "uvloop", n), "--set", f"http_server={server}"],
             build_env(build, args.compiled_lib, args.before_lib))
            for n in numbers(args.processes) for server in names(args.http_servers)
            for build in names(args.builds)
        ]  # fmt: skip
        if args.peer_python:
            targets.append(
                ("sglang-router (cache_aware)", peer_argv(args.peer_python, worker_port, 0), PEER_ENV)
            )
        print(f"thousands of instructions per served request (callgrind), concurrency {args.concurrency}, "
              f"{args.requests} requests")  # fmt: skip
        print("| target | " + " | ".join(f"{chars:,} chars" for chars in sizes) + " |")
        print("|---|" + "---:|" * len(sizes))
        for label, argv, env in targets:
            cells = [per_request(argv, env, args, chars) for chars in sizes]
            print(f"| {label} | " + " | ".join(f"{c:.0f}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
