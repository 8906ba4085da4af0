"""Instructions per request of the router's handler and of a forward-only one, counted by Valgrind's
callgrind: ``request_path.py --handler``'s cycle without the machine's noise (issue 26).

On a shared machine the same build's CPU time per request moves by tens of percent from run to run; the
number of instructions it executes does not. Each cell runs two child processes under callgrind that
make the same ``2 * --cycles`` requests (``request_path.HandlerBench``, after ``--warm`` warm-up ones)
and differ only in how many they hand to the handler (``--cycles`` or twice that): the difference of
their counts, over ``--cycles``, is one request's instructions, start-up and request making left out.
``PYTHONHASHSEED`` is fixed: repeated runs gave counts within half a percent of each other.

Instructions are not time (a cache miss costs more than an add), so this is the check that a change
does less work, beside the timed benchmarks; ``--before DIR`` counts a second build (a tree's ``src`` or a
compiled one) in the same way.

    PYTHONPATH=$(scripts/build-compiled.sh) python benchmarks/instructions.py --before OTHER_BUILD
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import request_path

from prefix_router.lab.bench.overhead import bodies
from prefix_router.node.life.server import loop_factory

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


async def child(name: str, chars: int, stream: bool, warm: int, made: int, handled: int) -> None:
    """Make ``warm + made`` requests, handle the first ``warm + handled`` (``name``'s handler)."""
    bench = request_path.HandlerBench(stream)
    raws = request_path.request_bodies(bodies(warm + made, chars, stream))
    await bench.handle(name, [bench.request_for(raw) for raw in raws[:warm]])
    requests = [bench.request_for(raw) for raw in raws[warm:]]
    await bench.handle(name, requests[:handled])
    bench.state.log_handler.flush()  # type: ignore[union-attr]


def counted(path: str, name: str, chars: int, stream: bool, warm: int, made: int, handled: int) -> int:
    """Instructions of one child process under callgrind, with ``path`` first on ``PYTHONPATH``."""
    argv = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
        "--child", name, "--chars", str(chars), "--stream", str(int(stream)), "--warm", str(warm),
        "--made", str(made), "--handled", str(handled),
    ]  # fmt: skip
    out = subprocess.run(argv, env=child_env(path), capture_output=True, text=True, check=True)
    found = _COLLECTED.search(out.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count: {out.stderr[-500:]}")
    return int(found.group(1))


def child_env(path: str) -> dict[str, str]:
    """The children's environment: ``path`` first, a fixed hash seed, bytecode written (``prime``)."""
    env = {**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": "0"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def prime(path: str) -> None:
    """One child run outside Valgrind, uncounted: it writes the bytecode that the counted ones then load
    (compiling every source under callgrind took most of a child's time)."""
    argv = [sys.executable, __file__, "--child", "router", "--chars", "100", "--stream", "0", "--warm", "1",
            "--made", "1", "--handled", "1"]  # fmt: skip
    subprocess.run(argv, env=child_env(path), capture_output=True, check=True)


def per_request(path: str, name: str, chars: int, stream: bool, args: argparse.Namespace) -> float:
    """Instructions of one request, in thousands."""
    n = args.cycles
    with ThreadPoolExecutor(2) as pool:  # the two children at once, one per core
        low, high = pool.map(lambda k: counted(path, name, chars, stream, args.warm, 2 * n, k), (n, 2 * n))
    return (high - low) / n / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-chars", default="2000,32000")
    p.add_argument("--cycles", type=int, default=200, help="requests whose instructions are counted")
    p.add_argument("--warm", type=int, default=100)
    p.add_argument("--kinds", default="plain,stream", help="plain, stream or both")
    p.add_argument("--before", help="a package directory (a tree's src, a compiled build) to compare with")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--chars", type=int, help=argparse.SUPPRESS)
    p.add_argument("--stream", type=int, help=argparse.SUPPRESS)
    p.add_argument("--made", type=int, help=argparse.SUPPRESS)
    p.add_argument("--handled", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
            runner.run(child(args.child, args.chars, bool(args.stream), args.warm, args.made, args.handled))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("instructions.py needs valgrind (Debian: apt-get install valgrind)")
    sides = {"after": os.environ.get("PYTHONPATH", "")}
    if args.before:
        sides = {"before": args.before, **sides}
    print(f"build: {request_path.build_name()}; thousands of instructions per request (callgrind)")
    for side, path in sides.items():
        print(f"{side}: {path or '(this environment)'}")
        prime(path)
    print("| prompt | kind | side | router's handler | forward-only handler | router over forward-only |")
    print("|---:|---|---|---:|---:|---:|")
    for chars in (int(c) for c in args.prompt_chars.split(",")):
        for stream in (kind == "stream" for kind in args.kinds.split(",")):
            for side, path in sides.items():
                ours = per_request(path, "router", chars, stream, args)
                floor = per_request(path, "forward_only", chars, stream, args)
                kind = "stream" if stream else "plain"
                print(f"| {chars:,} | {kind} | {side} | {ours:.1f} | {floor:.1f} | {ours - floor:.1f} |")


if __name__ == "__main__":
    main()
