"""round_robin: each candidate in turn.

Algorithm: a counter modulo the number of candidates (candidates in name order, so the rotation is
stable when the candidate set is). A request takes one turn: its retries (the same ``route_id``, the failed
worker left out) reuse it, so a failing worker does not get every request's first attempt by consuming the
turns of others. Fallback: none needed. Knobs: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefix_router.routing.policies.base import NoHooks
from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot


class RoundRobinPolicy(NoHooks):
    def __init__(self) -> None:
        self._counter = 0
        self._turn = 0
        self._last: str | None = None  # the request that took the last turn

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        if req.route_id != self._last:
            self._turn, self._last = self._counter, req.route_id
            self._counter += 1
        ordered = sorted(workers, key=lambda w: w.name)
        chosen = ordered[self._turn % len(ordered)]
        return Decision(chosen.name, Branch.ROUND_ROBIN)
