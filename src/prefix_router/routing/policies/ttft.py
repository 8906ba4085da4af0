"""ttft: the worker where this request's first token comes soonest, counting what it costs the others.

Each candidate's first-token time is predicted in seconds by its worker's model (``routing/latency.py``,
learned online from the worker's own first tokens; ``ctx.latency``), with rates (overhead, prefill s per
token-equivalent, s per decoding request):

    cost  = ttft + delay + evict
    ttft  = overhead + prefill_s x (backlog + own) + decode_s x decoding
    delay = prefill_s x own x (decoding + D)   the requests decoding there wait while this prefill runs,
                                               and so do the D requests that will queue behind it
    evict = prefill_s x own x fill             a full cache evicts as much as it inserts: recomputed later
    own   = this request's prefill there: its prompt minus the prefix that worker holds (index), in
            token-equivalents (``backlog.prefill_work``: a token at context c costs 1 + c / attention_tokens)
    fill  = the fraction of that worker's cache in use (index)
    D     = W / (1 - rho): W the candidates' mean prefill backlog counted in typical requests
            (``ctx.request_work``), rho the utilisation of an M/M/1 queue that long (``prefix``'s
            ``delayed_requests``); 0 before a typical request is known

among the candidates under the bounded-load cap (``in_flight + 1 <= ceil(load_factor x (total in flight
+ 1) / total weight) + load_slack``, times its weight); the lowest wins, ties broken at random (seeded).
Every term is in seconds of the worker's own engine: no hand-set price. Before a worker has samples its
rates are the prior (0 s, ``prior_prefill_s_per_token``, the same per decoding request: a decoding
request adds about one token to each step).

Branches: ``prefix_hit`` (the chosen worker has the longest match), ``load_fallback`` (a worker with a
longer match was passed over), ``load_balance`` (no match anywhere). Fallback: no candidate under the cap:
the lowest cost among all. Without ``ctx.latency`` (a bare policy) every worker has the prior's rates.
Knobs (``routing.policies.ttft``, ``TtftSettings`` in ``ttft_settings.py``; defaults): ``load_factor``
2.0 (a safety bound only: the prediction prices load itself; 1.25 moved tenants off their holder at 8 in
flight on two engines), ``load_slack`` 2, ``prior_prefill_s_per_token`` 1e-4; and
``routing.trackers.attention_tokens``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prefix_router.routing.backlog import prefill_work
from prefix_router.routing.policies.base import NoHooks, cap_of, load_totals
from prefix_router.routing.policies.prefix import delayed_requests
from prefix_router.routing.policies.ttft_settings import TtftSettings
from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot

__all__ = ["TtftPolicy", "TtftSettings"]


class TtftPolicy(NoHooks):
    def __init__(self, knobs: TtftSettings) -> None:
        self.load_factor = knobs.load_factor
        self.load_slack = knobs.load_slack
        rate = knobs.prior_prefill_s_per_token
        self.prior = (0.0, rate, rate)

    def cost(self, req: RouteRequest, w: WorkerSnapshot, ctx: Context, delayed: float = 0.0) -> float:
        """``w``'s cost for ``req`` in seconds (see the module doc); ``delayed``: the requests that will
        queue behind a prefill placed now (``delayed_requests``)."""
        scale = ctx.token_scale
        prompt = req.key_tokens * scale
        cached = min(prompt, ctx.matches.get(w.name, 0) * req.block_tokens * scale)
        own = prefill_work(prompt - cached, cached, ctx.attention_tokens)
        latency = ctx.latency
        overhead, prefill_s, decode_s = self.prior if latency is None else latency.rates(w.name, self.prior)
        fill = 0.0
        if own and ctx.fills is not None:
            fill = ctx.fills.get(w.name, 0.0)
        elif own and ctx.cache is not None:
            fill = ctx.cache.fill(w.name)
        ttft = overhead + prefill_s * (w.prefill_backlog + own) + decode_s * w.decoding
        return ttft + prefill_s * own * (w.decoding + fill + delayed)

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        weight, flight, backlog = load_totals(workers)
        cap = cap_of(weight, flight, self.load_factor, self.load_slack)
        typical = ctx.request_work
        delayed = delayed_requests(backlog / len(workers) / typical) if typical > 0 else 0.0
        allowed = [w for w in workers if w.in_flight + 1 <= cap * w.weight] or list(workers)
        best, tied = math.inf, []
        for w in allowed:
            cost = self.cost(req, w, ctx, delayed)
            if cost < best:
                best, tied = cost, [w]
            elif cost == best:
                tied.append(w)
        chosen = tied[0] if len(tied) == 1 else ctx.rng.choice(tied)
        longest = max((ctx.matches.get(w.name, 0) for w in workers), default=0)
        return Decision(chosen.name, _branch(ctx.matches.get(chosen.name, 0), longest))


def _branch(matched: int, best: int) -> Branch:
    if best == 0:
        return Branch.LOAD_BALANCE
    return Branch.PREFIX_HIT if matched == best else Branch.LOAD_FALLBACK
