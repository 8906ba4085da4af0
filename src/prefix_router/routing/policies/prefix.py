"""prefix: the worker with the lowest estimated time to first token, within a bounded-load cap.

Algorithm: for each candidate under the bounded-load cap (``load_factor`` x mean in-flight + ``load_slack``;
all candidates if none is), estimate its prefill work in tokens:
    uncached prompt tokens on that worker (prompt - predicted cached prefix from the index)
  + pending prefill tokens already dispatched there and not yet past their first token
  + ``queue_penalty_tokens`` x the engine's waiting queue (when scraped and fresh)
  + ``in_flight_penalty_tokens`` x requests in flight there (decode steps slow down with batch size),
divided by the worker's weight, and pick the cheapest; ties break at random (seeded).
A hot prefix therefore spreads to a second and third worker once its holder reaches the cap or its queue
outweighs a cold prefill; a prompt that matches nowhere falls back to pure load balancing.
Branches: ``prefix_hit`` (the chosen worker has the longest match), ``load_fallback`` (a worker with a
longer match was passed over for load), ``load_balance`` (no match anywhere).
"""

from __future__ import annotations

from collections.abc import Sequence

from prefix_router.routing.policies.base import NoHooks, eligible, pick_min
from prefix_router.routing.types import Context, Decision, RouteRequest, WorkerSnapshot


class PrefixPolicy(NoHooks):
    name = "prefix"

    def __init__(
        self,
        load_factor: float,
        load_slack: int,
        queue_penalty_tokens: int,
        in_flight_penalty_tokens: int,
    ) -> None:
        self.load_factor = load_factor
        self.load_slack = load_slack
        self.queue_penalty_tokens = queue_penalty_tokens
        self.in_flight_penalty_tokens = in_flight_penalty_tokens

    def cost(self, req: RouteRequest, worker: WorkerSnapshot, matched_blocks: int) -> float:
        cached = min(matched_blocks * req.block_tokens, req.prompt_tokens)
        work = (
            req.prompt_tokens
            - cached
            + worker.pending_prefill_tokens
            + worker.queue_depth * self.queue_penalty_tokens
            + worker.in_flight * self.in_flight_penalty_tokens
        )
        return work / worker.weight

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        pool = eligible(workers, self.load_factor, self.load_slack)
        chosen = pick_min(pool, lambda w: self.cost(req, w, ctx.matches.get(w.name, 0)), ctx.rng)
        best = max((ctx.matches.get(w.name, 0) for w in workers), default=0)
        return Decision(chosen.name, _branch(ctx.matches.get(chosen.name, 0), best))


def _branch(matched: int, best: int) -> str:
    if best == 0:
        return "load_balance"
    return "prefix_hit" if matched == best else "load_fallback"
