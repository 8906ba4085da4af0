"""Two builds of prefix-router side by side in one run: the proxy's CPU per request, before and after.

One instant worker (``bench.instant_worker``), two routers in front of it (``serve --processes 1``, as
``bench-overhead`` starts them, access log on), loadgen rounds alternating between them (their order
swapped every round), for non-streamed and streamed chat requests at each prompt size and concurrency.
Printed: the best round's CPU us per request (the routers' own CPU time, the least noisy figure on a
shared machine) and req/s for each, after/before ratios, and the median over rounds of the after/before
CPU ratio of the two measurements made next to each other (the steadiest figure when the machine's load
changes during the run).

``--before`` and ``--after`` name a build: the path of a Python whose environment has prefix-router
installed (a venv's ``bin/python``), or a git commit of this repository (checked out into a temporary
worktree and run with this Python, its ``src/`` first on ``PYTHONPATH``). ``--after`` defaults to this tree.

    python benchmarks/proxy_before_after.py --before /work/main/.venv/bin/python \
        --requests 3000 --rounds 3 --prompt-chars 2000,32000 --concurrency 32,256
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prefix_router.lab.bench import overhead
from prefix_router.lab.bench.overhead import Case, Figures, Plan, Target
from prefix_router.lab.launch.net import free_port
from prefix_router.node import loop_factory

REPO = Path(__file__).resolve().parent.parent
Build = tuple[list[str], dict[str, str]]  # python argv prefix, extra environment
Results = dict[Case, dict[str, list[Figures]]]  # one Figures per round


@contextlib.contextmanager
def build(spec: str | None) -> Iterator[Build]:
    """(python argv prefix, extra env) running the build ``spec`` names (None: this tree, this Python)."""
    if spec is None:
        yield [sys.executable], {}
        return
    if Path(spec).is_file():
        yield [spec], {}
        return
    with tempfile.TemporaryDirectory(prefix="pr-build-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), spec], check=True)
        try:
            yield [sys.executable], {"PYTHONPATH": str(tree / "src")}
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)


async def bench(args: argparse.Namespace, builds: dict[str, Build]) -> Results:
    sizes, levels = overhead.numbers(args.prompt_chars), overhead.numbers(args.concurrency)
    cases = [Case(p, c) for p in sizes for c in levels]
    plan = Plan(args.requests, args.stream_chunks)
    worker_port = free_port()
    with overhead.processes() as spawn:
        worker = [sys.executable, "-m", "prefix_router.lab.bench.instant_worker", "--port", str(worker_port)]
        spawn([*worker, "--chunks", str(args.stream_chunks)], None)
        for name, (python, env) in builds.items():
            port = free_port()
            argv = overhead.router_argv(worker_port, port, "uvloop", 1, args.policy)
            pid = spawn([*python, *argv[1:], "--set", "access_log=true"], env)  # as shipped
            plan.targets.append(Target(name, port, pid, True))
        await overhead.wait_listening(worker_port)
        for target in plan.targets:
            await overhead.wait_listening(target.port)
        warm_up = Plan(max(1, args.requests // 4), plan.stream_chunks)
        for target in plan.targets:  # unmeasured
            await overhead.measure(target, cases[0], warm_up, _nop)
        results: Results = {case: {t.name: [] for t in plan.targets} for case in cases}
        for round_ in range(args.rounds):
            for case in cases:
                order = plan.targets if round_ % 2 == 0 else plan.targets[::-1]
                for target in order:
                    results[case][target.name].append(await overhead.measure(target, case, plan, _nop))
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    return results


def _nop() -> None:
    pass


def best(runs: list[Figures]) -> Figures:
    out = Figures()
    for figures in runs:
        out.merge(figures)
    return out


def report(results: Results, console: Console, rounds: int) -> None:
    table = Table(title=f"prefix-router before/after: instant worker, 1 process, {rounds} rounds")
    for column in ("prompt chars", "conc", "kind", "before us/req", "after us/req", "after/before CPU",
                   "median round CPU ratio", "before req/s", "after req/s", "after/before req/s",
                   "errors"):  # fmt: skip
        table.add_column(column, justify="right")
    for case, figures in results.items():
        before, after = best(figures["before"]), best(figures["after"])
        for kind, cpu, rate in (("plain", "cpu_plain_s", "rps"), ("stream", "cpu_stream_s", "sps")):
            b_cpu, a_cpu = getattr(before, cpu) * 1e6, getattr(after, cpu) * 1e6
            b_rate, a_rate = getattr(before, rate), getattr(after, rate)
            paired = [getattr(a, cpu) / getattr(b, cpu) for b, a in zip(*figures.values(), strict=True)]
            table.add_row(
                str(case.prompt_chars), str(case.concurrency), kind, f"{b_cpu:.0f}", f"{a_cpu:.0f}",
                f"{a_cpu / b_cpu:.2f}", f"{statistics.median(paired):.2f}", f"{b_rate:,.0f}",
                f"{a_rate:,.0f}", f"{a_rate / b_rate:.2f}", str(before.errors + after.errors),
            )  # fmt: skip
    console.print(table)
    console.print(
        "us/req and req/s: the best round of each (least disturbed by the rest of the machine); median "
        "round CPU ratio: after/before of the two measurements made next to each other in each round. CPU: "
        "the router process's user+system time per request (streams: per stream)."
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="a venv's python, or a git commit")
    p.add_argument("--after", default=None, help="a venv's python, or a git commit (default: this tree)")
    p.add_argument("--requests", type=int, default=3000, help="non-streamed requests per measurement")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-chars", default="2000,32000")
    p.add_argument("--concurrency", default="32,256")
    p.add_argument("--stream-chunks", type=int, default=8)
    p.add_argument("--policy", default="prefix")
    args = p.parse_args()
    with build(args.before) as before, build(args.after) as after:
        loop = loop_factory("uvloop")()
        try:
            results = loop.run_until_complete(bench(args, {"before": before, "after": after}))
        finally:
            loop.close()
    report(results, Console(width=160), args.rounds)
    errors = sum(f.errors for figures in results.values() for runs in figures.values() for f in runs)
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
