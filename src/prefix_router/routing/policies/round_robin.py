"""round_robin: each candidate in turn.

Algorithm: a counter modulo the number of candidates (candidates in name order, so the rotation is
stable when the candidate set is). Fallback: none needed. Knobs: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefix_router.routing.policies.base import NoHooks
from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot


class RoundRobinPolicy(NoHooks):
    def __init__(self) -> None:
        self._counter = 0

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        ordered = sorted(workers, key=lambda w: w.name)
        chosen = ordered[self._counter % len(ordered)]
        self._counter += 1
        return Decision(chosen.name, Branch.ROUND_ROBIN)
