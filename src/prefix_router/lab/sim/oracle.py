"""The ``oracle`` row: the same requests on one engine cache with the pooled capacity of all instances.

Requests are replayed in arrival order through one ``PrefixCache`` (the engine's LRU) holding
``instances x capacity`` tokens; each request's prompt (and reply, when known) is cached as soon as it is
seen. No router can beat it by placing requests on separate LRU engines of the same total size (up to
LRU's own quirks), so it is the practical ceiling of the hit rate; ``ideal_hit_rate`` (an unbounded
cache) is reported next to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prefix_router.lab.sim.engine import EngineRequest
from prefix_router.lab.sim.kvcache import PrefixCache


@dataclass(frozen=True, slots=True)
class OracleResult:
    hit_rate: float
    ideal_hit_rate: float
    capacity_tokens: int


def cached_tokens(hit_blocks: int, block_tokens: int, prompt_tokens: int, page: int) -> int:
    """Hit tokens as the engine reports them: at least the last prompt token is computed."""
    return min(hit_blocks * block_tokens, (prompt_tokens - 1) // page * page)


class PooledCache:
    """One LRU cache replayed request by request."""

    def __init__(self, capacity_tokens: int, block_tokens: int, page: int) -> None:
        self.cache = PrefixCache(max(1, capacity_tokens // block_tokens), block_tokens)
        self.block_tokens = block_tokens
        self.page = page
        self.prompt = 0
        self.cached = 0

    def replay(self, req: EngineRequest) -> None:
        total = max(len(req.blocks), len(req.extension))
        if total > self.cache.capacity_blocks:
            return
        allocation = self.cache.allocate(req.blocks, total)
        if allocation is None:
            return
        self.cache.mark_computed(req.blocks)
        hit = cached_tokens(allocation.hit_blocks, self.block_tokens, req.prompt_tokens, self.page)
        self.prompt += req.prompt_tokens
        self.cached += hit
        private = total - len(req.blocks)
        self.cache.release(req.blocks, private, req.extension[len(req.blocks) :])

    @property
    def hit_rate(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0


IDEAL_CAPACITY_TOKENS = 10**12  # "unbounded": far more than any trace holds, still a bound


def oracle(
    requests: Iterable[EngineRequest], capacity_tokens: int, block_tokens: int, page: int
) -> OracleResult:
    """Pooled-cache and unbounded-cache hit rates of ``requests`` (in arrival order)."""
    pooled = PooledCache(capacity_tokens, block_tokens, page)
    ideal = PooledCache(IDEAL_CAPACITY_TOKENS, block_tokens, page)
    for req in requests:
        pooled.replay(req)
        ideal.replay(req)
    return OracleResult(pooled.hit_rate, ideal.hit_rate, pooled.cache.capacity_blocks * block_tokens)
