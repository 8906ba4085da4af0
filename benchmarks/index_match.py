"""The prefix index's match, side by side with the per-block Python loop it replaced, in one run.

``bench-index``'s set-up (``--workers`` workers, ``--blocks`` indexed blocks in chains of 64), then a
prompt of each ``--prompt-chars`` fully indexed on 3 workers (a hit) and one indexed nowhere (a miss).
Both implementations run on the same index, alternating, ``--repeats`` times each; printed: p50 per call
and the ratio, plus the whole ``route`` (the ``prefix`` policy's decision) for scale.

    python benchmarks/index_match.py --workers 64 --blocks 200000 --prompt-chars 2000 16000
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator, Sequence

from rich.console import Console
from rich.table import Table

from prefix_router.bench import index_bench
from prefix_router.routing.index import PrefixIndex
from prefix_router.routing.keys import KeyBuilder


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def loop_match(index: PrefixIndex, blocks: Sequence[int]) -> dict[str, int]:
    """The match before: a Python loop narrowing the mask of still-matching workers block by block."""
    holders, names, result = index._holders, index._name, {}
    alive = -1
    for depth, block in enumerate(blocks):
        held = holders.get(block, 0) & alive
        if held == alive:
            continue
        if depth:
            for bit in _bits(alive & ~held):
                result[names[bit]] = depth
        alive = held
        if not alive:
            return result
    for bit in _bits(alive if blocks else 0):
        result[names[bit]] = len(blocks)
    return result


def p50_us(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - started) / 1000)
    return statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--blocks", type=int, default=200_000)
    p.add_argument("--prompt-chars", type=int, nargs="+", default=[2000, 16000])
    p.add_argument("--repeats", type=int, default=2000)
    args = p.parse_args()
    cfg = index_bench.IndexBenchConfig(workers=args.workers, blocks=args.blocks)
    router = index_bench.make_router(cfg)
    index_bench.fill(router, cfg.blocks, cfg.seed)
    keys, index = KeyBuilder(router.cfg.keys), router.index
    table = Table(title=f"index match, {args.workers} workers, {args.blocks:,} blocks: p50 us per call")
    for column in ("prompt chars", "case", "loop (before)", "accumulate (now)", "x faster", "route, now"):
        table.add_column(column, justify="right")
    for chars in args.prompt_chars:
        miss = keys.build("chat", index_bench.body_of(chars, 1), request_id="miss")
        hit = keys.build("chat", index_bench.body_of(chars, 2), request_id="hit")
        for worker in router.workers()[: index_bench.HIT_WORKERS]:
            index.insert(worker, hit.blocks, now=1e6)
        for case, req in (("miss", miss), ("hit", hit)):
            assert index.match(req.blocks) == loop_match(index, req.blocks)
            before, now = [], []
            for _ in range(5):  # alternating, so that both see the same machine
                before.append(p50_us(lambda: loop_match(index, req.blocks), args.repeats // 5))
                now.append(p50_us(lambda: index.match(req.blocks), args.repeats // 5))
            decide = index_bench._Decisions(router, req)
            route = p50_us(decide.route, args.repeats // 5)
            b, n = statistics.median(before), statistics.median(now)
            table.add_row(str(chars), case, f"{b:.1f}", f"{n:.1f}", f"{b / n:.1f}", f"{route:.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
