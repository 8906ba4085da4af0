"""``bench-index``'s global-cap case: the cost of inserting a request once ``max_total_blocks`` binds.

Every block inserted beyond the cap evicts one block of the fullest worker. Two indexes run side by side
over the same operations: ``PrefixIndex`` (workers kept in buckets by size: amortised O(1) per evicted
block) and ``ScanEvictionIndex``, the same index with the fullest worker found by a ``max()`` over every
worker per evicted block (the plain reference). Each is filled to its cap over
``workers`` workers, then each measured round inserts one request's worth of new blocks on every worker
in turn (so every insert evicts as many blocks), alternating the two indexes to share the machine's noise.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from prefix_router.lab.bench.summary import quantile
from prefix_router.routing import PrefixIndex


class ScanEvictionIndex(PrefixIndex):
    """The baseline: the fullest worker by a scan over every worker (O(workers) per evicted block)."""

    def _fullest_worker(self) -> str:
        return max(self.workers(), key=self.blocks_of)


@dataclass(frozen=True, slots=True)
class CapBenchSettings:
    workers: int = 256
    total_blocks: int = 100_000  # max_total_blocks, filled before measuring
    request_blocks: int = 250  # new blocks per request (a 16,000-character prompt at 64 chars a block)
    requests: int = 200
    seed: int = 0


def make_index(cls: type[PrefixIndex], cfg: CapBenchSettings) -> PrefixIndex:
    index = cls(
        block_tokens=16, default_capacity_tokens=1 << 40, max_total_blocks=cfg.total_blocks, ttl_s=1e9
    )
    for i in range(cfg.workers):
        index.add_worker(f"w{i}")
    return index


def chains(cfg: CapBenchSettings, count: int, salt: int) -> list[tuple[int, ...]]:
    rng = random.Random(f"{cfg.seed}:{salt}")
    return [tuple(rng.getrandbits(64) for _ in range(cfg.request_blocks)) for _ in range(count)]


def fill(index: PrefixIndex, cfg: CapBenchSettings) -> None:
    workers = index.workers()
    for n, chain in enumerate(chains(cfg, cfg.total_blocks // cfg.request_blocks + 1, salt=-1)):
        index.insert(workers[n % len(workers)], chain, now=float(n))


def run_cap(cfg: CapBenchSettings) -> dict[str, Any]:
    """Per-request insert time (microseconds) of both indexes, and their ratio."""
    indexes = {"buckets": make_index(PrefixIndex, cfg), "scan": make_index(ScanEvictionIndex, cfg)}
    for index in indexes.values():
        fill(index, cfg)
    samples: dict[str, list[float]] = {name: [] for name in indexes}
    evictions = {name: index.evictions for name, index in indexes.items()}
    workers = indexes["buckets"].workers()
    for n, chain in enumerate(chains(cfg, cfg.requests, salt=0)):
        for name, index in indexes.items():
            started = time.perf_counter_ns()
            index.insert(workers[n % len(workers)], chain, now=1e6 + n * 1e-3)  # no TTL sweep
            samples[name].append((time.perf_counter_ns() - started) / 1000.0)
    out: dict[str, Any] = {"workers": cfg.workers, "max_total_blocks": cfg.total_blocks,
                           "request_blocks": cfg.request_blocks, "requests": cfg.requests}  # fmt: skip
    for name, index in indexes.items():
        times = sorted(samples[name])
        evicted = index.evictions - evictions[name]
        out[name] = {"p50_us": round(quantile(times, 0.5), 1), "p99_us": round(quantile(times, 0.99), 1),
                     "us_per_evicted_block": round(sum(times) / max(1, evicted), 3),
                     "evicted_blocks": evicted, "entries": len(index)}  # fmt: skip
    out["scan_over_buckets"] = round(out["scan"]["p50_us"] / max(out["buckets"]["p50_us"], 1e-9), 1)
    return out
