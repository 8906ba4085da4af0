"""What valuing text keys by their content costs (``routing/units.py``), side by side in one run.

    .venv/bin/python benchmarks/units_cost.py [--chars 2000 16000 128000] [--rounds 15] [--json OUT]

Per prompt length (a chat body of one user message of English-like text, ``bench-index``'s), interleaved
in ``rounds`` rounds so that the shared machine's noise falls on every column alike:

- ``key``: ``KeyBuilder.build`` (validate, canonicalise, cut into chained block hashes, and count the
  key's bytes by class, which the content value needs);
- ``count``: ``count_marks`` over the key's bytes alone (the part of ``key`` the content value adds);
- ``route``: ``Router.route`` of the prompt fully indexed on 3 of 64 workers (1,000,000 blocks indexed),
  and of a prompt whose first half only is indexed (on 3 others), the model's units learned (10 reports),
  with ``UnitTuning.by_content`` on (the match valued by the classes of its own blocks: one more count,
  of the matched bytes or of the rest, whichever is shorter) and off (nominal x the scale).

Printed: the median over rounds of each mean, in microseconds, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from prefix_router.lab.bench.index_bench import IndexBenchSettings, body_of, fill
from prefix_router.routing import (
    IndexSettings,
    KeyBuilder,
    Outcome,
    Router,
    RouteRequest,
    RoutingSettings,
    UnitTuning,
    count_marks,
)

WORKERS = 64
BLOCKS = 1_000_000


def make_router(by_content: bool) -> Router:
    index = IndexSettings(max_total_blocks=2 * BLOCKS, ttl_s=1e9, worker_capacity_tokens=1 << 40)
    cfg = RoutingSettings(policy="prefix", index=index)
    router = Router(cfg, rng=random.Random(0), units=UnitTuning(by_content=by_content))
    for i in range(WORKERS):
        router.add_worker(f"w{i}")
    fill(router, BLOCKS, IndexBenchSettings().seed)
    return router


def teach(router: Router, keys: KeyBuilder) -> None:
    """Ten answered requests of other prompts: the model's value is learned (warm-up 8)."""
    for n in range(10):
        req = keys.build("chat", body_of(8_000, 100 + n), route_id=f"teach{n}")
        decision = router.route(req, ["w0"], 0.0)
        router.dispatched(req, decision, 0.0)
        router.finished(req, "w0", Outcome(True, None, (), req.key_tokens * 4 // 5), 0.0)


def mean_us(fn: Callable[[], object], repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat * 1e6


def measure(chars: int, routers: dict[bool, Router], rounds: int, repeat: int) -> dict[str, float]:
    keys = KeyBuilder(routers[True].cfg.keys)
    body = body_of(chars, 0)
    req: RouteRequest = keys.build("chat", body, route_id="probe")
    workers = routers[True].workers()
    for router in routers.values():
        for worker in workers[:3]:
            router.index.insert(worker, req.blocks, now=1e6)
    # the same prompt's first half indexed on 3 other workers, matched by a prompt that goes on elsewhere
    half = replace(req, blocks=req.blocks[: len(req.blocks) // 2] + tuple(range(1, len(req.blocks) // 2 + 1)))
    for router in routers.values():
        for worker in workers[3:6]:
            router.index.insert(worker, half.blocks[: len(req.blocks) // 2], now=1e6)
    columns: dict[str, Callable[[], object]] = {
        "key": lambda: keys.build("chat", body, route_id="k"),
        "count": lambda: count_marks(req.text),
        "route_content": lambda: routers[True].route(req, workers, 1e6, policy="prefix"),
        "route_scale": lambda: routers[False].route(req, workers, 1e6, policy="prefix"),
        "half_content": lambda: routers[True].route(half, workers, 1e6, policy="prefix"),
        "half_scale": lambda: routers[False].route(half, workers, 1e6, policy="prefix"),
    }
    samples: dict[str, list[float]] = {name: [] for name in columns}
    for _ in range(rounds):
        for name, fn in columns.items():
            samples[name].append(mean_us(fn, repeat))
    out = {name: statistics.median(values) for name, values in samples.items()}
    predicted = {k: r.route(req, workers, 1e6).predicted_tokens for k, r in routers.items()}
    out.update(chars=chars, predicted_content=predicted[True], predicted_scale=predicted[False])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chars", type=int, nargs="+", default=[2_000, 16_000, 128_000])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    routers = {flag: make_router(flag) for flag in (True, False)}
    keys = KeyBuilder(routers[True].cfg.keys)
    for router in routers.values():
        teach(router, keys)
    results = [measure(chars, routers, args.rounds, args.repeat) for chars in args.chars]
    print(f"{'chars':>8} {'key µs':>8} {'count µs':>9} {'count/key':>9} | full hit: {'content':>8} "
          f"{'scale':>8} {'ratio':>6} | half hit: {'content':>8} {'scale':>8} {'ratio':>6}")  # fmt: skip
    for r in results:
        print(f"{r['chars']:>8,} {r['key']:>8.1f} {r['count']:>9.1f} {r['count'] / r['key']:>9.3f} | "
              f"{'':>9} {r['route_content']:>8.1f} {r['route_scale']:>8.1f} "
              f"{r['route_content'] / r['route_scale']:>6.3f} | {'':>9} {r['half_content']:>8.1f} "
              f"{r['half_scale']:>8.1f} {r['half_content'] / r['half_scale']:>6.3f}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
