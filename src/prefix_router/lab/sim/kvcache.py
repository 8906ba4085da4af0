"""A paged KV cache with automatic prefix caching, modelled on vLLM V1.

Memory is counted in fixed-size blocks. A prompt's *full* blocks are identified by chained hashes
(``blocks[i]`` names the whole prefix of the first i+1 blocks), so a request reuses the longest run of
leading blocks that are resident and already computed. Blocks no running request holds stay cached in a
free queue and are evicted least recently used first; a finished request returns its blocks tail first,
so the deepest blocks of a prefix go before its head (as vLLM's ``KVCacheManager.free``). Tokens that do
not fill a block (the partial tail of the prompt, the output being generated) occupy "private" blocks
that are freed, not cached, unless the engine hands their hashes in when the request finishes. A reset
(``/reset_prefix_cache``, a restarted process) drops every cached block: the ones running requests hold
stay theirs until they end ("detached": they occupy memory but are hits for no one and are not cached
again), so that the engine's ``AllBlocksCleared`` is true.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, KeysView, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Allocation:
    """The outcome of admitting one request: how many leading blocks were already computed."""

    hit_blocks: int


# what an engine would publish as KV cache events: ("stored" | "removed", block) or ("cleared", 0)
CacheListener = Callable[[str, int], None]


class PrefixCache:
    """Block accounting and prefix lookup for one engine. ``capacity_blocks`` bounds every structure.
    ``listener`` (None: nothing) is told of every block that becomes a hit (stored), every evicted one
    (removed) and every reset (cleared), as vLLM's KV cache events do."""

    def __init__(self, capacity_blocks: int, block_tokens: int) -> None:
        if capacity_blocks < 1 or block_tokens < 1:
            raise ValueError("capacity_blocks and block_tokens must be positive")
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self._ref: dict[int, int] = {}  # resident hashed block -> number of running requests holding it
        self._free: OrderedDict[int, None] = OrderedDict()  # ref 0, cached; first = next victim
        self._pending: set[int] = set()  # allocated, not computed yet: not a hit for anyone
        self._private = 0
        self._detached: dict[int, int] = {}  # held when the cache was reset -> requests holding it
        self.evictions = 0
        self.listener: CacheListener | None = None

    # ------------------------------------------------------------------ queries

    @property
    def used_blocks(self) -> int:
        """Blocks occupied: every resident hashed block plus private and detached blocks."""
        return len(self._ref) + self._private + len(self._detached)

    @property
    def active_blocks(self) -> int:
        """Blocks held by running requests (what vLLM reports as KV-cache usage)."""
        return len(self._ref) - len(self._free) + self._private + len(self._detached)

    @property
    def cached_blocks(self) -> int:
        """Resident hashed blocks (held or evictable)."""
        return len(self._ref)

    def resident(self) -> KeysView[int]:
        """The hashes of every resident block (a live read-only view)."""
        return self._ref.keys()

    def contains(self, block: int) -> bool:
        return block in self._ref

    def match(self, blocks: Sequence[int]) -> int:
        """Leading blocks that are resident and computed (no side effects)."""
        ref, pending = self._ref, self._pending
        hits = 0
        for block in blocks:
            if block not in ref or block in pending:
                break
            hits += 1
        return hits

    # ------------------------------------------------------------------ admission

    def allocate(self, blocks: Sequence[int], total_blocks: int) -> Allocation | None:
        """Hold ``blocks`` and ``total_blocks - len(blocks)`` private blocks, evicting LRU as needed.

        Returns None (and changes nothing) when even evicting every free block would not make room.
        """
        hits = self.match(blocks)
        new, free_held = self._count_new(blocks)
        need = new + max(0, total_blocks - len(blocks))
        room = self.capacity_blocks - self.used_blocks + len(self._free) - free_held
        if need > room:
            return None
        self._hold(blocks)
        self._evict(need - (self.capacity_blocks - self.used_blocks))
        self._insert_pending(blocks)
        self._private += max(0, total_blocks - len(blocks))
        return Allocation(hits)

    def _count_new(self, blocks: Sequence[int]) -> tuple[int, int]:
        """(blocks not resident, resident blocks currently evictable) among ``blocks``."""
        new = free_held = 0
        ref = self._ref
        for block in blocks:
            count = ref.get(block)
            if count is None:
                new += 1
            elif count == 0:
                free_held += 1
        return new, free_held

    def _hold(self, blocks: Sequence[int]) -> None:
        ref, free = self._ref, self._free
        for block in blocks:
            count = ref.get(block)
            if count is None:
                continue
            if count == 0:
                del free[block]
            ref[block] = count + 1

    def _evict(self, count: int) -> None:
        ref, free = self._ref, self._free
        for _ in range(max(0, count)):
            victim, _ = free.popitem(last=False)
            del ref[victim]
            self.evictions += 1
            if self.listener is not None:
                self.listener("removed", victim)

    def _insert_pending(self, blocks: Sequence[int]) -> None:
        ref, pending = self._ref, self._pending
        for block in blocks:
            if block not in ref:
                ref[block] = 1
                pending.add(block)

    def mark_computed(self, blocks: Sequence[int]) -> None:
        """The prefill computed these blocks: from now on they are hits for other requests."""
        if self._pending:
            listener = self.listener
            for block in blocks:
                if listener is not None and block in self._pending:
                    listener("stored", block)
                self._pending.discard(block)

    # ------------------------------------------------------------------ release

    def release(self, blocks: Sequence[int], private: int, extension: Sequence[int] = ()) -> None:
        """A request ends: cache ``extension`` (its generated full blocks, using up to ``private``
        private blocks), then return every block, tail first, to the free queue."""
        self._private -= private
        converted = self._cache_extension(extension[:private])
        self._return(converted)
        self._return(blocks)

    def _cache_extension(self, extension: Sequence[int]) -> list[int]:
        ref = self._ref
        held: list[int] = []
        for block in extension:
            if self.used_blocks >= self.capacity_blocks:
                break
            count = ref.get(block)
            if count == 0:
                del self._free[block]
            elif count is None and self.listener is not None:
                self.listener("stored", block)
            ref[block] = (count or 0) + 1
            held.append(block)
        return held

    def _return(self, blocks: Sequence[int]) -> None:
        ref, free, pending, detached = self._ref, self._free, self._pending, self._detached
        for block in reversed(blocks):
            held = detached.get(block)
            if held is not None:  # held since before a reset: freed, not cached
                if held > 1:
                    detached[block] = held - 1
                else:
                    del detached[block]
                continue
            count = ref[block] - 1
            if count > 0:
                ref[block] = count
            elif block in pending:
                del ref[block]
                pending.discard(block)
            else:
                ref[block] = 0
                free[block] = None

    def reset(self) -> int:
        """Drop every cached block (vLLM's ``/reset_prefix_cache``, or a restarted engine process): the
        free ones at once, the held ones when their requests end (detached until then); returns how many
        were cached."""
        dropped = len(self._ref)
        detached = self._detached
        for block, count in self._ref.items():
            if count:
                detached[block] = detached.get(block, 0) + count
        self._ref.clear()
        self._free.clear()
        self._pending.clear()
        if self.listener is not None:
            self.listener("cleared", 0)
        return dropped
