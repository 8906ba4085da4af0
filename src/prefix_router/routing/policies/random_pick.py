"""random: the baseline, what a plain load balancer does.

Algorithm: pick a candidate at random, proportionally to its weight. No fallback needed. Knobs: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefix_router.routing.policies.base import NoHooks
from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot


class RandomPolicy(NoHooks):
    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        chosen = ctx.rng.choices(workers, weights=[w.weight for w in workers])[0]
        return Decision(chosen.name, Branch.RANDOM)
