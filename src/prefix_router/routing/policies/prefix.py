"""prefix: the worker with the lowest expected cost of this request *and* of what it does to the fleet.

For each candidate under the bounded-load cap (``in_flight + 1 <= ceil(load_factor x (total in flight +
1) / total weight) + load_slack``, times its weight; all candidates if none is), or under
``hit_cap_factor`` x that cap for a *cheap hit* (it holds at least ``hit_cap_share`` of the prompt and the
prefill left there is no more than the fleet's mean request's), in token-equivalents of prefill work
(``backlog.prefill_work``: a token at context c costs 1 + c / attention_tokens):

    cost = backlog                                 prefill still queued there (backlog.py)
         + queue_penalty_tokens x engine queue     (scraped, when fresh: waiting for admission)
         + in_flight_penalty_tokens x waiting      in flight before their first token (ahead of it;
                                                   other replicas' requests too)
         + decoding_penalty_tokens x decoding      this router's in flight past their first token
                                                   (they share the steps: decode slows with the batch)
                                                   (the default: as much as a waiting request)
         + (1 + recompute_weight x fill + saturation_weight x D) x work
    work = this request's prefill there: its prompt minus the prefix that worker holds (index)
    fill = the fraction of that worker's cache in use (index): 1 when inserting there evicts
    D    = requests delayed by a token of prefill placed now: W / (1 - rho), W the fleet's mean backlog
           counted in typical requests, rho the utilisation of an M/M/1 queue that long

divided by the worker's weight; the cheapest wins, ties broken at random (seeded). Why each term, and
what the peers do instead: docs/routing.md, "The prefix cost model".

Branches: ``prefix_hit`` (the chosen worker has the longest match), ``load_fallback`` (a worker with a
longer match was passed over: by cost or by the cap), ``load_balance`` (no match anywhere).
Fallback: no candidate under its cap (nor a cheap hit under ``hit_cap_factor`` x it): the cheapest of all.

This is the ``select`` step of the router's pipeline (``routing/placement.py``, where each step states
its contract). Before it: ``match`` and ``steer`` make ``ctx.matches`` (the prefix index's, or a fresh
event-fed worker's engine view), ``load`` the snapshots, ``stick`` (session affinity) and ``home``
(precise: a prefix held nowhere back to its last home) may decide instead, under their own load caps, and
``estimate`` makes ``ctx.token_scale``. After it: ``confirmed``, ``value`` and ``round`` turn the chosen
worker's match into the prediction in engine tokens (units, whole engine blocks).
Knobs (``routing.policies.prefix``, ``PrefixSettings`` in ``prefix_settings.py``, a pydantic class
kept out of this module, which the release build compiles; defaults): ``load_factor`` 1.25, ``load_slack`` 2,
``queue_penalty_tokens`` 512, ``in_flight_penalty_tokens`` 512, ``decoding_penalty_tokens`` 512,
``recompute_weight`` 1.0, ``saturation_weight`` 1.0, ``hit_cap_factor`` 2.0 (1: the cap binds every
request), ``hit_cap_share`` 0.9; and ``routing.trackers.attention_tokens`` 32,768 (the unit of prefill work).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from operator import attrgetter

from prefix_router.routing.backlog import prefill_work
from prefix_router.routing.policies.base import NoHooks, cap_of, load_totals
from prefix_router.routing.policies.prefix_settings import PrefixSettings
from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot

__all__ = ["PrefixPolicy", "PrefixSettings", "delayed_requests"]


class PrefixPolicy(NoHooks):
    def __init__(self, knobs: PrefixSettings) -> None:
        self.load_factor = knobs.load_factor
        self.load_slack = knobs.load_slack
        self.queue_penalty_tokens = knobs.queue_penalty_tokens
        self.in_flight_penalty_tokens = knobs.in_flight_penalty_tokens
        self.decoding_penalty_tokens = knobs.decoding_penalty_tokens
        self.recompute_weight = knobs.recompute_weight
        self.saturation_weight = knobs.saturation_weight
        self.hit_cap_factor = knobs.hit_cap_factor
        self.hit_cap_share = knobs.hit_cap_share

    def saturation(self, workers: Sequence[WorkerSnapshot], request_work: float) -> float:
        """``saturation_weight x`` the requests delayed by a token of prefill placed now (see the header);
        0 while no typical request size is known yet."""
        return self.saturation_of(sum(map(_BACKLOG, workers)), len(workers), request_work)

    def saturation_of(self, backlog: float, workers: int, request_work: float) -> float:
        """``saturation`` of ``workers`` candidates whose prefill backlogs sum to ``backlog``."""
        if request_work <= 0 or not workers:
            return 0.0
        return self.saturation_weight * delayed_requests(backlog / workers / request_work)

    def cheapest(
        self,
        req: RouteRequest,
        workers: Sequence[WorkerSnapshot],
        matches: dict[str, int],
        cap: float,
        base: float,
        ctx: Context,
    ) -> tuple[list[WorkerSnapshot], int]:
        """The workers under ``cap`` with the lowest cost, and the longest match among all the workers,
        in one inlined pass (this runs for every candidate of every request: nothing else walks them;
        a worker that matches nothing costs a few reads, its prefill work being the same everywhere)."""
        scale = ctx.token_scale  # engine tokens per key token (routing/units.py)
        prompt, block = req.key_tokens * scale, req.block_tokens * scale
        best, tied, longest = math.inf, [], 0
        queue_penalty, flight_penalty = self.queue_penalty_tokens, self.in_flight_penalty_tokens
        # a request past its first token is priced decoding_penalty_tokens instead of flight_penalty
        decoding_extra = self.decoding_penalty_tokens - flight_penalty
        attention, cache = ctx.attention_tokens, ctx.cache
        evicting = self.recompute_weight if cache is not None else 0.0
        fill = _fill_reader(ctx)
        cold = prefill_work(prompt, 0, attention)  # the work on every worker that matches nothing
        cold_fill = cache is not None and bool(cold)  # whether a cold worker's cost reads its fill
        hard, cheap = cap * self.hit_cap_factor, ctx.request_work
        held = self.hit_cap_share * prompt
        base_cold = base * cold  # a cold worker's ``factor x work`` with an empty cache
        for w in workers:
            name, flight = w.name, w.in_flight
            if name in matches and (matched := matches[name]):
                if matched > longest:
                    longest = matched
                over = flight + 1 > cap * w.weight
                if over and flight + 1 > hard * w.weight:
                    continue
                cached = min(prompt, matched * block)
                work = prefill_work(prompt - cached, cached, attention)
                if over and (cached < held or work > cheap):
                    continue  # above the cap only for a cheap hit: the prompt held, little work left
                factor = base + evicting * fill(name, 0.0) if cache is not None and work else base
                wait = w.prefill_backlog + w.queue_depth * queue_penalty
                wait += flight * flight_penalty + w.decoding * decoding_extra
            elif flight + 1 > cap * w.weight:
                continue
            else:
                wait = w.prefill_backlog + w.queue_depth * queue_penalty
                wait += flight * flight_penalty + w.decoding * decoding_extra
                if cold_fill and (wait + base_cold) / w.weight > best:
                    continue  # its cost with an empty cache already loses: no need to read its fill
                work = cold
                factor = base + evicting * fill(name, 0.0) if cold_fill else base
            cost = (wait + factor * work) / w.weight
            if cost < best:
                best, tied = cost, [w]
            elif cost == best:
                tied.append(w)
        return tied, longest

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        weight, flight, backlog = load_totals(workers)  # the sums of ``saturation`` and ``load_cap``
        base = 1.0 + self.saturation_of(backlog, len(workers), ctx.request_work)
        cap = cap_of(weight, flight, self.load_factor, self.load_slack)
        tied, longest = self.cheapest(req, workers, ctx.matches, cap, base, ctx)
        if not tied:
            tied, _ = self.cheapest(req, workers, ctx.matches, math.inf, base, ctx)
        chosen = tied[0] if len(tied) == 1 else ctx.rng.choice(tied)
        return Decision(chosen.name, _branch(ctx.matches.get(chosen.name, 0), longest))


_BACKLOG: Callable[[WorkerSnapshot], float] = attrgetter("prefill_backlog")


def _fill_reader(ctx: Context) -> Callable[[str, float], float]:
    """``(worker, default) -> fill``: the live mapping's ``get``, or a call of ``ctx.cache.fill``."""
    if ctx.fills is not None:
        return ctx.fills.get
    cache = ctx.cache
    return lambda worker, _default: cache.fill(worker) if cache is not None else 0.0


def delayed_requests(waiting: float) -> float:
    """Requests delayed by work added to a queue holding ``waiting`` requests: those that will arrive
    before it drains, W / (1 - rho), with the utilisation rho of an M/M/1 queue of that length
    (W = rho^2 / (1 - rho)). 0 for an empty queue; grows without bound as the queue does.

    With s = sqrt(W^2 + 4W), rho = (s - W) / 2 and 1 - rho = 4W / (s + W)^2, so W / (1 - rho) =
    (s + W)^2 / 4: written that way, without the subtraction that cancels to 0 for a long queue (the
    direct form lost all precision near W = 1e7 and divided by zero from about 3e8)."""
    if waiting <= 0:
        return 0.0
    root = math.sqrt(waiting * waiting + 4.0 * waiting)
    return (root + waiting) * (root + waiting) / 4.0


def _branch(matched: int, best: int) -> Branch:
    if best == 0:
        return Branch.LOAD_BALANCE
    return Branch.PREFIX_HIT if matched == best else Branch.LOAD_FALLBACK
