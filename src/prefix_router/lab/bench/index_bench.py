"""``prefix-router bench-index``: the prefix index's memory per indexed block and the decision time.

A ``Router`` with ``--workers`` workers (default 64) is filled with ``--blocks`` indexed blocks (default
1,000,000: chains of 64 random block hashes, spread round-robin over the workers), measuring the memory
the index grows by with ``tracemalloc`` (Python allocations: dicts, OrderedDicts, ints). Then, per prompt
length (default 16,000 and 128,000 characters, a chat request with one user message), it times the
request path's three routing steps, each ``--repeats`` times:

- ``key``: the routing key (validate the body, cut the prompt into chained block hashes);
- ``route``: the ``prefix`` policy's decision (index match over all workers, load, choice);
- ``dispatch``: recording the decision (index insert of the request's blocks, load tracking);

for a prompt none of whose blocks is indexed (``miss``) and one fully indexed on 3 workers (``hit``).

Last, the global-cap case (``bench/index_cap.py``): inserting requests once ``max_total_blocks`` binds
over ``--cap-workers`` workers (default 256), the index against the scan-per-evicted-block baseline, side
by side in one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from prefix_router.lab.bench.index_cap import CapBenchSettings, run_cap
from prefix_router.lab.bench.summary import quantile
from prefix_router.lab.bench.table import output_console
from prefix_router.lab.workloads.text import random_text, rng_for
from prefix_router.routing import IndexSettings, KeyBuilder, Outcome, Router, RouteRequest, RoutingSettings

CHAIN_BLOCKS = 64
HIT_WORKERS = 3


@dataclass(frozen=True, slots=True)
class IndexBenchSettings:
    workers: int = 64
    blocks: int = 1_000_000
    prompt_chars: tuple[int, ...] = (16_000, 128_000)
    repeats: int = 200
    seed: int = 0
    cap: CapBenchSettings = field(default_factory=CapBenchSettings)


def make_router(cfg: IndexBenchSettings) -> Router:
    index = IndexSettings(
        max_total_blocks=max(2_000_000, cfg.blocks * 2), ttl_s=1e9, worker_capacity_tokens=1 << 40
    )
    routing = RoutingSettings(policy="prefix", index=index)
    router = Router(routing, rng=random.Random(cfg.seed))
    for i in range(cfg.workers):
        router.add_worker(f"w{i}")
    return router


def fill(router: Router, blocks: int, seed: int) -> None:
    """Insert ``blocks`` random block hashes, as chains of 64, round-robin over the workers."""
    rng = random.Random(seed)
    workers = router.workers()
    for n, start in enumerate(range(0, blocks, CHAIN_BLOCKS)):
        chain = tuple(rng.getrandbits(64) for _ in range(min(CHAIN_BLOCKS, blocks - start)))
        router.index.insert(workers[n % len(workers)], chain, now=float(n))


def measure_fill(router: Router, blocks: int, seed: int) -> dict[str, float]:
    """Fill under tracemalloc: bytes per indexed block and the fill's wall time (slowed by tracing)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    fill(router, blocks, seed)
    elapsed = time.perf_counter() - started
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"bytes": after - before, "bytes_per_block": (after - before) / max(1, blocks), "fill_s": elapsed}


def body_of(chars: int, seed: int) -> dict[str, Any]:
    text = random_text(rng_for("index-bench", seed, chars), chars // 4 + 1)[:chars]
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def timed(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    """p50, p99 and mean of ``fn``'s wall time in microseconds."""
    samples = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - started) / 1000.0)
    samples.sort()
    return {"p50": round(quantile(samples, 0.5), 1), "p99": round(quantile(samples, 0.99), 1),
            "mean": round(sum(samples) / len(samples), 1)}  # fmt: skip


class _Decisions:
    """Route + dispatch + finish of one prompt, with fresh request ids (so the load tracker stays bounded)."""

    def __init__(self, router: Router, req: RouteRequest) -> None:
        self.router, self.req, self.count = router, req, 0
        self.workers = router.workers()

    def route(self) -> object:
        return self.router.route(self.req, self.workers, now=1e6, policy="prefix")

    def dispatch(self) -> None:
        self.count += 1
        req = RouteRequest(f"r{self.count}", self.req.blocks, self.req.block_tokens, self.req.key_tokens,
                           self.req.hash_key)  # fmt: skip
        decision = self.router.route(req, self.workers, now=1e6, policy="prefix")
        self.router.dispatched(req, decision, now=1e6)
        self.router.finished(req, decision.worker, Outcome(ok=True), now=1e6)


def measure_prompt(router: Router, chars: int, cfg: IndexBenchSettings) -> dict[str, Any]:
    keys = KeyBuilder(router.cfg.keys)
    body = body_of(chars, cfg.seed)
    req = keys.build("chat", body, route_id="probe")
    out: dict[str, Any] = {"blocks": len(req.blocks)}
    out["key_us"] = timed(lambda: keys.build("chat", body, route_id="k"), cfg.repeats)
    out["miss_route_us"] = timed(_Decisions(router, req).route, cfg.repeats)
    for worker in router.workers()[:HIT_WORKERS]:
        router.index.insert(worker, req.blocks, now=1e6)
    decisions = _Decisions(router, req)
    out["hit_route_us"] = timed(decisions.route, cfg.repeats)
    out["hit_route_dispatch_finish_us"] = timed(decisions.dispatch, cfg.repeats)
    return out


def run(cfg: IndexBenchSettings) -> dict[str, Any]:
    router = make_router(cfg)
    memory = measure_fill(router, cfg.blocks, cfg.seed)
    result: dict[str, Any] = {"workers": cfg.workers, "indexed_blocks": len(router.index), **memory}
    result["unique_blocks"] = router.index.unique_blocks()
    result["prompts"] = {}
    for chars in cfg.prompt_chars:
        result["prompts"][str(chars)] = measure_prompt(router, chars, cfg)
    result["global_cap"] = run_cap(cfg.cap)
    return result


def render(result: dict[str, Any], console: Console) -> None:
    console.print(f"prefix index: {result['workers']} workers, {result['indexed_blocks']:,} indexed blocks, "
                  f"{result['bytes_per_block']:.1f} bytes per block (tracemalloc; "
                  f"{result['bytes'] / 2**20:.1f} MiB in all)")  # fmt: skip
    table = Table(title="decision time (microseconds, p50 / p99)")
    for column in (
        "prompt chars",
        "blocks",
        "routing key",
        "route (miss)",
        "route (hit)",
        "route+dispatch+finish",
    ):
        table.add_column(column, justify="right")
    for chars, p in result["prompts"].items():
        cells = [p[k] for k in ("key_us", "miss_route_us", "hit_route_us", "hit_route_dispatch_finish_us")]
        table.add_row(chars, str(p["blocks"]), *(f"{c['p50']:.1f} / {c['p99']:.1f}" for c in cells))
    console.print(table)
    cap = result["global_cap"]
    buckets, scan = cap["buckets"], cap["scan"]
    console.print(
        f"global cap binding ({cap['workers']} workers, max_total_blocks {cap['max_total_blocks']:,}, "
        f"{cap['request_blocks']} new blocks per request): insert p50 / p99 "
        f"{buckets['p50_us']:,.0f} / {buckets['p99_us']:,.0f} us (size buckets) vs "
        f"{scan['p50_us']:,.0f} / {scan['p99_us']:,.0f} us (a scan per evicted block): "
        f"{cap['scan_over_buckets']}x"
    )


def index_command(args: argparse.Namespace) -> int:
    cap = CapBenchSettings(workers=args.cap_workers, total_blocks=args.cap_blocks)
    cfg = IndexBenchSettings(workers=args.workers, blocks=args.blocks, prompt_chars=tuple(args.prompt_chars),
                           repeats=args.repeats, cap=cap)  # fmt: skip
    console = output_console()
    with console.status(f"indexing {cfg.blocks:,} blocks over {cfg.workers} workers (tracemalloc on)..."):
        result = run(cfg)
    render(result, console)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0
