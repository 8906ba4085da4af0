"""The prefix index's writes per request (``insert_chain``, as ``dispatched`` and ``finished`` make them),
one build against another, side by side in one run.

Each build runs in its own child process (its package directory first on ``PYTHONPATH``: ``src`` for the
pure build, a directory ``scripts/build-compiled.sh`` printed for a compiled one) over the same seeded
state: 8 workers holding 12,000 blocks each, then requests made of a system prompt every worker holds and
a question of their own (2 KB: 28 + 4 blocks, 32 KB: 480 + 20), each written twice into one worker (the
prompt at dispatch, then the same chain once more: held whole); and, on a ninth worker kept full (12,000
blocks, its capacity), 32 KB prompts of 500 new blocks each, written once (a new prompt's dispatch: 500
blocks added, 500 evicted). The children take turns, one slice of requests each, ``--rounds`` times;
printed: CPU per request (thread time, its writes), the median and the least over the slices, per build
and prompt.

    python benchmarks/index_touch.py --builds src,"$(scripts/build-compiled.sh)"
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = (("2 KB", 28, 4), ("32 KB", 480, 20))
NEW = ("32 KB new, full worker", 500)  # blocks of a new prompt, on a worker at its capacity
FULL_BLOCKS = 12_000


def child(per_slice: int) -> int:
    from prefix_router.routing import PrefixIndex

    rng = random.Random(1)
    index = PrefixIndex(
        block_tokens=16, default_capacity_tokens=16 * 60_000, max_total_blocks=200_000, ttl_s=1e9
    )
    workers = [f"w{i}" for i in range(8)]
    for worker in workers:
        index.add_worker(worker)
        index.insert_chain(worker, tuple(rng.getrandbits(63) for _ in range(12_000)), 0.0)
    systems = {name: tuple(rng.getrandbits(63) for _ in range(shared)) for name, shared, _ in SHAPES}
    for worker in workers:
        for system in systems.values():
            index.insert_chain(worker, system, 0.5)
    index.add_worker("full", 16 * FULL_BLOCKS)
    index.insert_chain("full", tuple(rng.getrandbits(63) for _ in range(FULL_BLOCKS)), 0.5)
    print(json.dumps({"ready": sys.modules[PrefixIndex.__module__].__file__}), flush=True)
    now = 1.0
    for line in sys.stdin:
        found: dict[str, float] = {}
        for name, _, new in SHAPES:
            requests = [
                systems[name] + tuple(rng.getrandbits(63) for _ in range(new)) for _ in range(per_slice)
            ]
            start = time.thread_time_ns()
            for blocks in requests:
                now += 1e-4
                index.insert_chain("w3", blocks, now)
                index.insert_chain("w3", blocks, now)
            found[name] = (time.thread_time_ns() - start) / per_slice / 1e3
        fresh = [tuple(rng.getrandbits(63) for _ in range(NEW[1])) for _ in range(per_slice)]
        start = time.thread_time_ns()
        for blocks in fresh:
            now += 1e-4
            index.insert_chain("full", blocks, now)
        found[NEW[0]] = (time.thread_time_ns() - start) / per_slice / 1e3
        print(json.dumps(found), flush=True)
        if line.strip() == "last":
            return 0
    return 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--builds", default="src", help="package directories, comma-separated (src: the pure one)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--per-slice", type=int, default=50, help="requests per slice")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.per_slice)
    dirs = [str(ROOT / "src") if d == "src" else d for d in args.builds.split(",")]
    procs = []
    for path in dirs:
        env = {**os.environ, "PYTHONPATH": path}
        argv = [sys.executable, __file__, "--child", f"--per-slice={args.per_slice}"]
        procs.append(
            subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )
    for path, proc in zip(dirs, procs, strict=True):
        assert proc.stdout is not None
        print(f"{path}: index from {json.loads(proc.stdout.readline())['ready']}")
    slices: list[list[dict[str, float]]] = [[] for _ in procs]
    for round_ in range(args.rounds):
        for i, proc in enumerate(procs):
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("last\n" if round_ == args.rounds - 1 else "slice\n")
            proc.stdin.flush()
            slices[i].append(json.loads(proc.stdout.readline()))
    for proc in procs:
        proc.wait(30)
    print("| build | prompt | us per request, median | least |")
    print("|---|---|---:|---:|")
    for path, found in zip(dirs, slices, strict=True):
        for name in [*(shape[0] for shape in SHAPES), NEW[0]]:
            values = [s[name] for s in found]
            print(f"| {path} | {name} | {statistics.median(values):.1f} | {min(values):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
