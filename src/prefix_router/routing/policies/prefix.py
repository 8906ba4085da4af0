"""prefix: the worker with the lowest expected cost of this request *and* of what it does to the fleet.

Algorithm. For each candidate under the bounded-load cap (``in_flight + 1 <= ceil(load_factor x (total in
flight + 1) / total weight) + load_slack``, times its weight; all candidates if none is), in token-
equivalents of prefill work (``drain.prefill_work``: a token at context c costs 1 + c / attention_tokens):

    cost = backlog                                  prefill still queued there (learned drain, drain.py)
         + queue_penalty_tokens x engine queue      (scraped, when fresh: other routers' requests)
         + in_flight_penalty_tokens x in flight     (decode steps slow down with the batch)
         + (1 + recompute_weight + saturation_weight x W) x work
    work = the request's prefill there: its prompt minus the prefix that worker holds (index)
    W    = requests waiting for their first token, per candidate (fleet mean)

divided by the worker's weight; the cheapest wins, ties broken at random (seeded).

Why. ``backlog + work`` is this request's own time to first token. The rest prices the future:
- a recomputed token is paid twice more than its own prefill: the holder's copy of the prefix is left
  unused in its cache while the new copy evicts something elsewhere (``recompute_weight``, 1 token);
- the prefill capacity it takes delays the requests queued behind it: about W of them, by M/G/1's
  W = rho / (1 - rho) (``saturation_weight``); W grows without bound as the fleet saturates, so the
  policy sticks to the holders harder and harder exactly when capacity is scarce.
So a worker holding the prefix is left only when its expected wait exceeds the recomputation by that
margin (``2 + W`` times it); a hot prefix is then copied deliberately to the cheapest other worker, and
from then on both holders share it by cost. Prompts that match nowhere go where the wait is shortest.
The bounded-load cap is a hard guarantee on top: no worker takes a request above it.

Branches: ``prefix_hit`` (the chosen worker has the longest match), ``load_fallback`` (a worker with a
longer match was passed over: by cost or by the cap), ``load_balance`` (no match anywhere).
Knobs (defaults): ``load_factor`` 1.25, ``load_slack`` 2, ``queue_penalty_tokens`` 512,
``in_flight_penalty_tokens`` 512, ``recompute_weight`` 1.0, ``saturation_weight`` 1.0, and the router's
``attention_tokens`` 32,768.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prefix_router.routing.drain import prefill_work
from prefix_router.routing.policies.base import NoHooks, load_cap
from prefix_router.routing.types import Context, Decision, RouteRequest, WorkerSnapshot


class PrefixPolicy(NoHooks):
    name = "prefix"
    honours_sessions = True

    def __init__(
        self,
        load_factor: float,
        load_slack: int,
        queue_penalty_tokens: int,
        in_flight_penalty_tokens: int,
        recompute_weight: float = 1.0,
        saturation_weight: float = 1.0,
        attention_tokens: int = 32_768,
    ) -> None:
        self.load_factor = load_factor
        self.load_slack = load_slack
        self.queue_penalty_tokens = queue_penalty_tokens
        self.in_flight_penalty_tokens = in_flight_penalty_tokens
        self.recompute_weight = recompute_weight
        self.saturation_weight = saturation_weight
        self.attention_tokens = attention_tokens

    def weight_of_work(self, workers: Sequence[WorkerSnapshot]) -> float:
        """``1 + recompute_weight + saturation_weight x W``: what one token of prefill placed now costs."""
        waiting = sum(w.pending_prefill_requests for w in workers) / max(1, len(workers))
        return 1.0 + self.recompute_weight + self.saturation_weight * waiting

    def cheapest(
        self,
        req: RouteRequest,
        workers: Sequence[WorkerSnapshot],
        matches: dict[str, int],
        cap: float,
        factor: float,
    ) -> list[WorkerSnapshot]:
        """The workers under ``cap`` with the lowest cost, in one inlined pass (this runs for every
        candidate of every request)."""
        prompt, block, best, tied = req.prompt_tokens, req.block_tokens, math.inf, []
        queue_penalty, flight_penalty, attention = (
            self.queue_penalty_tokens,
            self.in_flight_penalty_tokens,
            self.attention_tokens,
        )
        for w in workers:
            if w.in_flight + 1 > cap * w.weight:
                continue
            cached = min(prompt, matches.get(w.name, 0) * block)
            work = prefill_work(prompt - cached, cached, attention)
            wait = w.prefill_backlog + w.queue_depth * queue_penalty + w.in_flight * flight_penalty
            cost = (wait + factor * work) / w.weight
            if cost < best:
                best, tied = cost, [w]
            elif cost == best:
                tied.append(w)
        return tied

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        factor = self.weight_of_work(workers)
        cap = load_cap(workers, self.load_factor, self.load_slack)
        tied = self.cheapest(req, workers, ctx.matches, cap, factor)
        tied = tied or self.cheapest(req, workers, ctx.matches, math.inf, factor)
        chosen = tied[0] if len(tied) == 1 else ctx.rng.choice(tied)
        names = {w.name for w in workers} if ctx.matches else set()
        best = max((m for n, m in ctx.matches.items() if n in names), default=0)
        return Decision(chosen.name, _branch(ctx.matches.get(chosen.name, 0), best))


def _branch(matched: int, best: int) -> str:
    if best == 0:
        return "load_balance"
    return "prefix_hit" if matched == best else "load_fallback"
