"""consistent_hash: consistent hashing with bounded loads (CHWBL, as KubeAI's).

Algorithm: the request's ``hash_key`` (a hash of the first ``hash_prefix_chars`` of its routing key,
within its namespace) is placed on a ring of ``replicas`` virtual nodes per worker (times its weight);
walk clockwise to the first worker whose load is under the bounded-load cap
(``load_factor`` x mean in-flight, plus ``load_slack``). Fallback: if every worker is at the cap, the
least loaded. Knobs: ``hash_prefix_chars``, ``load_factor``, ``load_slack``, ``replicas``.
Rings are cached per candidate set, in a bounded LRU.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence

from prefix_router.routing.hashing import hash_bytes
from prefix_router.routing.policies.base import NoHooks, load_cap, pick_min, under_cap
from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot

_Ring = tuple[list[int], list[str]]


def build_ring(workers: Sequence[tuple[str, float]], replicas: int) -> _Ring:
    points = sorted(
        (hash_bytes(f"{name}#{i}".encode()), name)
        for name, weight in workers
        for i in range(max(1, round(replicas * weight)))
    )
    return [p for p, _ in points], [n for _, n in points]


class ConsistentHashPolicy(NoHooks):
    name = "consistent_hash"
    honours_sessions = True

    def __init__(self, load_factor: float, load_slack: int, replicas: int = 64, max_rings: int = 32) -> None:
        self.load_factor = load_factor
        self.load_slack = load_slack
        self.replicas = replicas
        self.max_rings = max_rings
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
