"""least_load: the candidate with the fewest outstanding requests (per unit of weight).

Algorithm: outstanding = requests in flight through this router plus the engine's scraped queue depth
(when fresh). Ties break at random. Fallback: none needed. Knobs: none (see ``power_of_two`` for the
sampled variant).
"""

from __future__ import annotations

from collections.abc import Sequence

from prefix_router.routing.policies.base import NoHooks, pick_min
from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot


def outstanding(worker: WorkerSnapshot) -> float:
    return (worker.in_flight + worker.queue_depth) / worker.weight


class LeastLoadPolicy(NoHooks):
    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        return Decision(pick_min(workers, outstanding, ctx.rng).name, Branch.LEAST_LOAD)
