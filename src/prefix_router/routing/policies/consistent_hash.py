"""consistent_hash: consistent hashing with bounded loads (CHWBL, as KubeAI's).

Algorithm: the request's ``hash_key`` (a hash of the first 512 bytes of its routing key,
``routing/keys.py``'s ``HASH_PREFIX_CHARS``, within its namespace) is placed on a ring of ``replicas``
virtual nodes per worker (times its weight); walk clockwise to the first worker whose load is under the
bounded-load cap (``load_factor`` x mean in-flight, plus ``load_slack``: 0 by default, as in CHWBL).
Fallback: if every worker is at the cap, the least loaded. Knobs (``routing.policies.consistent_hash``,
``ConsistentHashSettings``): ``load_factor``, ``load_slack``, ``replicas``. Rings are cached per candidate
set, in an LRU of ``MAX_RINGS``.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence

from pydantic import Field

from prefix_router.routing.hashing import hash_bytes
from prefix_router.routing.policies.base import NoHooks, load_cap, pick_min, under_cap
from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot
from prefix_router.settings import Section

_Ring = tuple[list[int], list[str]]


def build_ring(workers: Sequence[tuple[str, float]], replicas: int) -> _Ring:
    points = sorted(
        (hash_bytes(f"{name}#{i}".encode()), name)
        for name, weight in workers
        for i in range(max(1, round(replicas * weight)))
    )
    return [p for p, _ in points], [n for _, n in points]


# rings cached, one per candidate set: the sets a fleet routes over at once (all workers, those serving
# one model, those of one LoRA adapter) are few; 32 covers a fleet of that many models
MAX_RINGS = 32


class ConsistentHashSettings(Section):
    """``routing.policies.consistent_hash``: the bounded-load cap and the ring."""

    load_factor: float = Field(default=1.25, gt=0)  # cap: load_factor x mean in flight ...
    load_slack: int = Field(default=0, ge=0)  # ... + load_slack requests (CHWBL: none)
    replicas: int = Field(default=64, ge=1, le=4096)  # virtual nodes per worker (times its weight)


class ConsistentHashPolicy(NoHooks):
    def __init__(self, knobs: ConsistentHashSettings) -> None:
        self.load_factor = knobs.load_factor
        self.load_slack = knobs.load_slack
        self.replicas = knobs.replicas
        self.max_rings = MAX_RINGS
        self._rings: OrderedDict[tuple[tuple[str, float], ...], _Ring] = OrderedDict()

    def _ring(self, workers: Sequence[WorkerSnapshot]) -> _Ring:
        key = tuple(sorted((w.name, w.weight) for w in workers))
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = build_ring(key, self.replicas)
            while len(self._rings) > self.max_rings:
                self._rings.popitem(last=False)
        self._rings.move_to_end(key)
        return ring

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        points, names = self._ring(workers)
        by_name = {w.name: w for w in workers}
        cap = load_cap(workers, self.load_factor, self.load_slack)
        start = bisect.bisect_left(points, req.hash_key)
        for step in range(len(points)):
            worker = by_name[names[(start + step) % len(points)]]
            if under_cap(worker, cap):
                return Decision(worker.name, Branch.HASH if step == 0 else Branch.HASH_OVERFLOW)
        return Decision(
            pick_min(workers, lambda w: w.in_flight / w.weight, ctx.rng).name, Branch.LOAD_FALLBACK
        )

    def on_worker_removed(self, worker: str) -> None:
        self._rings.clear()
