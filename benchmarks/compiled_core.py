"""The routing core's cost per request cycle, compiled build vs pure, side by side in one run.

Two child processes, one per build (the pure package: ``src``; the compiled one: ``--compiled-lib``, as
``scripts/build-compiled.sh`` prints it, first on ``PYTHONPATH``), each holding ``floor_core``'s settings
(the proxy's default router with the ``prefix`` policy, the benchmark's requests, ``--in-flight`` in
flight): key, route, dispatched, first_token, extension and finished per cycle, the JSON parse apart.
The parent runs ``--rounds`` slices of ``--cycles`` cycles, alternating the builds every slice so that
drift on a shared machine touches both alike, then prints each stage's mean CPU per cycle (microseconds,
scaled by each child's CPU share as floor_core does) for both builds and the ratio pure / compiled.

    python benchmarks/compiled_core.py --compiled-lib "$(scripts/build-compiled.sh)"

``--before-lib DIR``: the first child runs another compiled build (an older commit's, built by its own
``scripts/build-compiled.sh``) instead of the pure one: two compiled builds before and after a change.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILDS = ("pure", "compiled")


def child(args: argparse.Namespace) -> int:
    from floor_core import STAGES, run_slice, settings_for

    import prefix_router.routing.index as index

    sizes, workers = [int(s) for s in args.prompt_chars.split(",")], [int(w) for w in args.workers.split(",")]
    settings = settings_for(sizes, workers, args.cycles * args.rounds, args.in_flight)
    print(json.dumps({"ready": index.__file__}), flush=True)
    for line in sys.stdin:
        if line.strip() == "slice":
            run_slice(settings, args.cycles)
            print(json.dumps({"done": True}), flush=True)
        elif line.strip() == "report":
            costs = [dataclasses.asdict(s.cost()) for s in settings]
            print(json.dumps({"stages": list(STAGES), "costs": costs}), flush=True)
            return 0
    return 1


def spawn(build: str, lib: str, argv: list[str], before_lib: str = "") -> subprocess.Popen[str]:
    path = (before_lib or str(HERE.parent / "src")) if build == "pure" else lib
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, str(HERE)])}
    return subprocess.Popen(
        [sys.executable, __file__, "--child", *argv],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def ask(proc: subprocess.Popen[str], command: str) -> dict[str, object]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    answer: dict[str, object] = json.loads(proc.stdout.readline())
    return answer


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compiled-lib", default=os.environ.get("COMPILED_ROUTING_CORE_LIB", ""))
    p.add_argument("--prompt-chars", default="2000,32000")
    p.add_argument("--workers", default="1,8")
    p.add_argument("--cycles", type=int, default=500, help="cycles per slice")
    p.add_argument("--rounds", type=int, default=6, help="slices per build, alternating")
    p.add_argument("--in-flight", type=int, default=32)
    p.add_argument("--before-lib", default="", help="a compiled build to run in place of the pure one")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if not args.compiled_lib:
        print("--compiled-lib DIR (scripts/build-compiled.sh prints it)")
        return 2
    argv = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("prompt_chars", "workers", "cycles")]
    argv += [f"--rounds={args.rounds}", f"--in-flight={args.in_flight}"]
    procs = {b: spawn(b, args.compiled_lib, argv, args.before_lib) for b in BUILDS}
    for build, proc in procs.items():
        assert proc.stdout is not None
        where = str(json.loads(proc.stdout.readline())["ready"])
        label = "before (compiled)" if build == "pure" and args.before_lib else build
        print(f"{label}: prefix_router.routing.index from {where}")
        assert where.endswith(".py") == (build == "pure" and not args.before_lib), (
            f"{build} build imported {where}"
        )
    if args.before_lib:
        print("the 'pure' columns below are the --before-lib build's")
    for _ in range(args.rounds):
        for proc in procs.values():
            ask(proc, "slice")
    reports = {b: ask(proc, "report") for b, proc in procs.items()}
    for proc in procs.values():
        proc.wait(30)
    print_table(reports)
    return 0


def print_table(reports: dict[str, dict[str, object]]) -> None:
    stages = [*reports["pure"]["stages"], "total"]  # type: ignore[misc]
    pure, compiled = reports["pure"]["costs"], reports["compiled"]["costs"]
    print(f"{'chars':>6} {'workers':>7} {'stage':>12} {'pure us':>9} {'compiled us':>12} {'x faster':>9}")
    for a, b in zip(pure, compiled, strict=True):  # type: ignore[call-overload]
        for stage in stages:
            x = a["total_us"] if stage == "total" else a["mean_us"][stage]
            y = b["total_us"] if stage == "total" else b["mean_us"][stage]
            print(f"{a['prompt_chars']:>6} {a['workers']:>7} {stage:>12} {x:>9.1f} {y:>12.1f} {x / y:>9.2f}")
        print(f"{'':>6} {'':>7} {'p50 cycle':>12} {a['p50_us']:>9.1f} {b['p50_us']:>12.1f}", end="")
        print(f" {a['p50_us'] / b['p50_us']:>9.2f}   CPU share {a['cpu_share']:.2f} / {b['cpu_share']:.2f}")
    print("Both builds in one run, slices alternating; parse (orjson) is outside the core in both.")


if __name__ == "__main__":
    sys.exit(main())
