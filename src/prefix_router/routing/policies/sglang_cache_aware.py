"""sglang_cache_aware: an EMULATION of SGLang's router ``cache_aware`` policy, as a baseline.

Re-implemented from the public source of sgl-router (``src/policies/cache_aware.rs``, ``tree.rs``, the
defaults of ``launch_router``), not SGLang's code; it lets the simulator and the benchmark compare with
SGLang's algorithm in process, on exactly the same requests and engines.

Algorithm, per request (the loads are this router's in-flight requests per candidate):
1. Imbalance gate: if ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold x min``, the
   least loaded candidate (the first one in candidate order on ties). Branch ``load_balance``.
2. Otherwise the longest prefix match in the policy's own approximate tree; match rate = matched / prompt
   tokens. Above ``cache_threshold``: the worker holding the deepest matched node (ties: a fixed
   arbitrary order, as SGLang returns the first tenant of a hash map) -> ``prefix_hit``; else the worker
   whose tree is smallest -> ``smallest_tree``.
The chosen worker's tree then records the whole prompt. The tree is the router's record of what it sent
(never corrected by the engines): every ``eviction_interval_s`` each worker's tree is cut back to
``max_tree_chars`` characters, least recently used leaves first. With SGLang's default (2^26 characters,
about 16 M tokens per worker) the tree remembers far more than an engine's KV cache holds.

Emulation details: the tree is keyed by the routing key's chained blocks (whole blocks, not characters),
sizes are converted at ``CHARS_PER_TOKEN``; the trees are bounded in total by ``MAX_TREE_BLOCKS`` (the
fullest worker's tree gives way), where SGLang's grow freely between evictions. No session affinity
(SGLang's cache_aware has none). Fallback: none needed.
Knobs (SGLang's launch_router defaults): ``cache_threshold`` 0.3, ``balance_abs_threshold`` 64,
``balance_rel_threshold`` 1.5, ``eviction_interval_s`` 120, ``max_tree_chars`` 2^26. Constants of the
emulation: ``CHARS_PER_TOKEN`` 4, ``MAX_TREE_BLOCKS`` 2,000,000.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from prefix_router.routing.hashing import hash_bytes
from prefix_router.routing.index import PrefixIndex
from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot
from prefix_router.settings import Section

_UNBOUNDED_TOKENS = 1 << 60


# tree sizes, characters -> tokens: the routing key's nominal 4 characters a token (``keys.chars_per_token``'s
# default), which SGLang's character counts are converted at
CHARS_PER_TOKEN = 4.0
# blocks in all the trees together, a memory bound: the index's default bound (``index.max_total_blocks``)
MAX_TREE_BLOCKS = 2_000_000


class SGLangCacheAwareSettings(Section):
    """``sglang_cache_aware``'s knobs: SGLang's, with its launch_router defaults, and two of ours."""

    cache_threshold: float = Field(default=0.3, ge=0, le=1)  # match rate above which the holder wins
    balance_abs_threshold: int = Field(default=64, ge=0)  # imbalanced: max - min in flight above this
    balance_rel_threshold: float = Field(default=1.5, ge=1)  # ... and max above this x min
    eviction_interval_s: float = Field(default=120.0, gt=0)  # trees are cut back this often
    max_tree_chars: int = Field(default=2**26, gt=0)  # per worker, after a cut


class SGLangCacheAwarePolicy:
    def __init__(self, knobs: SGLangCacheAwareSettings) -> None:
        self.settings = knobs
        self.max_tree_tokens = max(1, int(knobs.max_tree_chars / CHARS_PER_TOKEN))
        self.tree: PrefixIndex | None = None  # built at the first request, with its block size
        self._order: dict[str, int] = {}
        self._next_eviction: float | None = None

    # ------------------------------------------------------------ decision

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        tree = self._tree(req.block_tokens)
        self._maintain(tree, workers, ctx.now)
        chosen, branch = self._choose(tree, req, workers, ctx.now)
        tree.insert(chosen, req.blocks, ctx.now)
        return Decision(chosen, branch)

    def _tree(self, block_tokens: int) -> PrefixIndex:
        if self.tree is None:
            self.tree = PrefixIndex(
                block_tokens=block_tokens,
                default_capacity_tokens=_UNBOUNDED_TOKENS,
                max_total_blocks=MAX_TREE_BLOCKS,
                ttl_s=math.inf,
            )
        return self.tree

    def _choose(
        self, tree: PrefixIndex, req: RouteRequest, workers: Sequence[WorkerSnapshot], now: float
    ) -> tuple[str, Branch]:
        s = self.settings
        loads = [w.in_flight for w in workers]
        high, low = max(loads), min(loads)
        if high - low > s.balance_abs_threshold and high > low * s.balance_rel_threshold:
            return workers[loads.index(low)].name, Branch.LOAD_BALANCE
        names = [w.name for w in workers]
        matches = tree.match(req.blocks)
        best = max((matches.get(n, 0) for n in names), default=0)
        rate = best * req.block_tokens / req.key_tokens if req.key_tokens > 0 else 0.0
        if best > 0:
            holder = min((n for n in names if matches.get(n, 0) == best), key=self._order.__getitem__)
            if rate > s.cache_threshold:
                return holder, Branch.PREFIX_HIT
            tree.insert(holder, req.blocks[:best], now)  # SGLang's match refreshes the holder's path
        return min(names, key=lambda n: (tree.tokens_of(n), self._order[n])), Branch.SMALLEST_TREE

    # ------------------------------------------------------------ tree upkeep

    def _maintain(self, tree: PrefixIndex, workers: Sequence[WorkerSnapshot], now: float) -> None:
        for w in workers:
            if w.name not in self._order:
                self._order[w.name] = hash_bytes(w.name.encode())
                tree.add_worker(w.name)
        if self._next_eviction is None:
            self._next_eviction = now + self.settings.eviction_interval_s
        elif now >= self._next_eviction:
            self._next_eviction = now + self.settings.eviction_interval_s
            self.evict(tree)

    def evict(self, tree: PrefixIndex) -> None:
        """Cut every worker's tree back to ``max_tree_chars`` (least recently used blocks first)."""
        for name in tree.workers():
            tree.set_capacity(name, self.max_tree_tokens)
            tree.set_capacity(name, _UNBOUNDED_TOKENS)

    def on_worker_removed(self, worker: str) -> None:
        if self.tree is not None:
            self.tree.remove_worker(worker)
        self._order.pop(worker, None)
