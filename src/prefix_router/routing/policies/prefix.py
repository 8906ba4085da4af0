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
Knobs (``routing.policies.prefix``, ``PrefixKnobs``): ``load_factor``, ``load_slack``,
``queue_penalty_tokens``, ``in_flight_penalty_tokens``.
Branches: ``prefix_hit`` (the chosen worker has the longest match), ``load_fallback`` (a worker with a
longer match was passed over for load), ``load_balance`` (no match anywhere).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from prefix_router.routing.policies.base import NoHooks, load_cap
from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot
from prefix_router.settings import Section


class PrefixKnobs(Section):
    """``routing.policies.prefix``: the bounded-load cap and the load penalties of the cost estimate."""

    load_factor: float = Field(default=1.25, gt=0)  # cap: load_factor x mean in flight ...
    load_slack: int = Field(default=2, ge=0)  # ... + load_slack requests
    queue_penalty_tokens: int = Field(default=512, ge=0)  # per request waiting in the engine's queue
    in_flight_penalty_tokens: int = Field(default=512, ge=0)  # per request in flight there


class PrefixPolicy(NoHooks):
    def __init__(self, knobs: PrefixKnobs) -> None:
        self.load_factor = knobs.load_factor
        self.load_slack = knobs.load_slack
        self.queue_penalty_tokens = knobs.queue_penalty_tokens
        self.in_flight_penalty_tokens = knobs.in_flight_penalty_tokens

    def cheapest(
        self, req: RouteRequest, workers: Sequence[WorkerSnapshot], matches: dict[str, int], cap: float
    ) -> list[WorkerSnapshot]:
        """The workers under ``cap`` with the lowest estimated work, in one inlined pass (this runs for
        every candidate of every request)."""
        prompt, block, best, tied = req.prompt_tokens, req.block_tokens, math.inf, []
        queue_penalty, flight_penalty = self.queue_penalty_tokens, self.in_flight_penalty_tokens
        for w in workers:
            if w.in_flight + 1 > cap * w.weight:
                continue
            uncached = max(0, prompt - matches.get(w.name, 0) * block)
            work = uncached + w.pending_prefill_tokens + w.queue_depth * queue_penalty
            cost = (work + w.in_flight * flight_penalty) / w.weight
            if cost < best:
                best, tied = cost, [w]
            elif cost == best:
                tied.append(w)
        return tied

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        tied = self.cheapest(req, workers, ctx.matches, load_cap(workers, self.load_factor, self.load_slack))
        tied = tied or self.cheapest(req, workers, ctx.matches, math.inf)
        chosen = tied[0] if len(tied) == 1 else ctx.rng.choice(tied)
        names = {w.name for w in workers} if ctx.matches else set()
        best = max((m for n, m in ctx.matches.items() if n in names), default=0)
        return Decision(chosen.name, _branch(ctx.matches.get(chosen.name, 0), best))


def _branch(matched: int, best: int) -> Branch:
    if best == 0:
        return Branch.LOAD_BALANCE
    return Branch.PREFIX_HIT if matched == best else Branch.LOAD_FALLBACK
