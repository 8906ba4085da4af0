"""The prefix index's match (a per-block Python loop) side by side with a variant tried and not kept.

The variant computes the running intersection of the blocks' holder masks with C iterators
(``accumulate(map(holders.get, ...), and_)`` cut by ``takewhile``) and finds each worker's depth by
bisection. Measured slower than the loop (0.5-0.7x): the iterator layers and the 64-bit masks' int
objects cost more per block than the loop's few bytecodes.

``bench-index``'s set-up (``--workers`` workers, ``--blocks`` indexed blocks in chains of 64), then a
prompt of each ``--prompt-chars`` fully indexed on 3 workers (a hit) and one indexed nowhere (a miss).
Both run on the same index, alternating, ``--repeats`` times each; printed: p50 per call and the ratio,
plus the whole ``route`` (the ``prefix`` policy's decision) for scale.

    python benchmarks/index_match.py --workers 64 --blocks 200000 --prompt-chars 2000 16000
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate, repeat, takewhile
from operator import and_

from rich.console import Console
from rich.table import Table

from prefix_router.lab.bench import index_bench
from prefix_router.routing import KeyBuilder, PrefixIndex


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def accumulate_match(index: PrefixIndex, blocks: Sequence[int]) -> dict[str, int]:
    """The variant: running intersection in C, then a bisection per worker of the first mask."""
    held = list(takewhile(bool, accumulate(map(index._holders.get, blocks, repeat(0)), and_)))
    result: dict[str, int] = {}
    for bit in _bits(held[0] if held else 0):
        flag, low, high = 1 << bit, 0, len(held)
        while low < high:
            mid = (low + high) // 2
            if held[mid] & flag:
                low = mid + 1
            else:
                high = mid
        result[index._name[bit]] = low
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
    cfg = index_bench.IndexBenchSettings(workers=args.workers, blocks=args.blocks)
    router = index_bench.make_router(cfg)
    index_bench.fill(router, cfg.blocks, cfg.seed)
    keys, index = KeyBuilder(router.cfg.keys), router.index
    table = Table(title=f"index match, {args.workers} workers, {args.blocks:,} blocks: p50 us per call")
    for column in ("prompt chars", "case", "index.match (loop)", "accumulate variant", "x loop", "route"):
        table.add_column(column, justify="right")
    for chars in args.prompt_chars:
        miss = keys.build("chat", index_bench.body_of(chars, 1), route_id="miss")
        hit = keys.build("chat", index_bench.body_of(chars, 2), route_id="hit")
        for worker in router.workers()[: index_bench.HIT_WORKERS]:
            index.insert(worker, hit.blocks, now=1e6)
        for case, req in (("miss", miss), ("hit", hit)):
            blocks = req.blocks
            assert index.match(blocks) == accumulate_match(index, blocks)
            loop, variant = [], []
            for _ in range(5):  # alternating, so that both see the same machine
                loop.append(p50_us(lambda b=blocks: index.match(b), args.repeats // 5))  # type: ignore[misc]
                variant.append(p50_us(lambda b=blocks: accumulate_match(index, b), args.repeats // 5))  # type: ignore[misc]
            decide = index_bench._Decisions(router, req)
            route = p50_us(decide.route, args.repeats // 5)
            a, v = statistics.median(loop), statistics.median(variant)
            table.add_row(str(chars), case, f"{a:.1f}", f"{v:.1f}", f"{v / a:.2f}", f"{route:.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
