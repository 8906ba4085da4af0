"""power_of_two: the less loaded of two candidates drawn at random (power of two choices).

Algorithm: sample two distinct candidates, keep the one with fewer outstanding requests (ties at
random). Cheaper than a full scan and robust to stale load views. Fallback: none needed (one candidate:
that one). Knobs: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefix_router.routing.policies.base import NoHooks, pick_min
from prefix_router.routing.policies.least_load import outstanding
from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot


class PowerOfTwoPolicy(NoHooks):
    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        pair = ctx.rng.sample(list(workers), 2) if len(workers) > 1 else list(workers)
        return Decision(pick_min(pair, outstanding, ctx.rng).name, Branch.POWER_OF_TWO)
