"""ttft: the worker where this request's first token comes soonest, counting what it costs the others.

Each candidate's first-token time is predicted in seconds by its worker's model (``routing/latency.py``,
learned online from the worker's own first tokens; ``ctx.latency``), with rates (overhead, prefill s per
token-equivalent, s per decoding request), and split into its parts (``CandidateEstimate``):

    cost    = ttft + added + cache                 the lowest wins
    ttft    = wait + prefill + decode              what the user waits for there
    wait    = overhead + prefill_s x backlog       the prefill queued ahead of it (engines prefill first
                                                   come, first served)
    prefill = prefill_s x own                      its own uncached prefill
    decode  = decode_s x decoding                  what the running decode batch adds to its steps
    added   = prefill_s x own x D                  the D requests that will queue behind this prefill
                                                   wait for it too
    cache   = prefill_s x evicted x (1 + D) x C    what its insertion evicts is recomputed later
    own     = this request's prefill there: its prompt minus the prefix that worker holds (index), in
              token-equivalents (``backlog.prefill_work``: a token at context c costs
              1 + c / attention_tokens)
    evicted = the uncached tokens beyond the room left in that worker's cache, plus the share
              ``occupancy`` of those that fit (the room is shared by whatever comes next: in a cache that
              full, that share of it displaces something before it is reused); own x occupancy where the
              capacity is unknown. occupancy = max(index fill, the engine's scraped KV usage): a running
              request's blocks take room the index may not count
    D       = W / (1 - rho): W the candidates' mean prefill backlog counted in typical requests
              (``ctx.request_work``), rho the utilisation of an M/M/1 queue that long; 0 before a typical
              request is known
    C       = 1 / (1 - f), at most the number of workers: f the occupancy of the roomiest worker's cache.
              What is evicted is recomputed where there is room, and where there is none it evicts in
              turn: in a fleet of full caches a copy sets off a chain of recomputes, not one (SIMULATED,
              quick grid of KV-bound cells: geomean TTFT vs the best emulated peer 1.17 -> 1.13, cells
              meeting every target 10 -> 14 of 24; Mooncake 16 engines: 97 -> 99 % of the oracle's hits)

Why staying on the holder is usually right: there ``own`` is small, so only the wait and the decode
batch count, and a decoding request adds one token to a step (``decode_s``, learned: small on an engine
with chunked prefill); elsewhere the whole prefix is computed, delays what queues behind it, and evicts
as much from a full cache, which another request recomputes later. It leaves when the holder's queue of
prefill (or its engine's learned decode cost) outweighs that.

Among the candidates under the bounded-load cap (``in_flight + 1 <= ceil(load_factor x (total in flight +
1) / total weight) + load_slack``, times its weight); the lowest cost wins, ties broken at random
(seeded). Every term is in seconds of the worker's own engine: no hand-set price. Before a worker has
samples its rates are the fleet's, before any sample the prior (0 s, ``prior_prefill_s_per_token``, the
same per decoding request: a decoding request adds about one token to each step). The decision carries
the chosen worker's ``ttft`` (``predicted_ttft_s``) and the ``MAX_ESTIMATES`` lowest costs' parts.

Honest about its error: a move off the incumbent (the cheapest holder of the longest match) is taken
only if the other candidate stays cheaper with the predicted waits (``wait`` and ``decode``) off by the
model's recent median relative error ``u`` (``LatencyView.uncertainty``: 1.0 until it has scored a few
first tokens) against it and for the incumbent: ``known(c) + waits(c) x (1 + u) < known(i) + waits(i) x
(1 - u)``, ``known`` = prefill + added + cache. The copy and the eviction a move costs are known; the
queue it avoids is a prediction (SIMULATED, the model is off by a median 19 % per cell, 1-83 %; on
two real vLLM CPU engines 29-42 %).

A new home for a prefix nobody holds: that placement decides where the requests that share it go next,
for as long as it stays cached, while the costs compare queues that drain in a second. Among the
candidates whose cost and ``cache`` part are both within ``u`` of the cheapest's (``<= x (1 + u)``: what
a copy evicts is known, and in a small cache a new prefix still goes where it evicts least), it goes to
the one that took the fewest new prefixes lately (each weighs 1, and all are decayed by 1 - 1 /
``HOMES_MEMORY``, 32, at each new one), then the cheaper: tenants are spread over the fleet as SGLang's
smallest tree spreads them, where the costs say nothing surer (SIMULATED, quick grid of KV-bound cells:
on the cost alone 5 of 8 tenants were homed on one of 2 GPU engines in 2 of 6 seeds at 32 in flight, and
its queue never drained: TTFT 181 -> 31 ms against SGLang's 33; geomean vs the best emulated peer 1.13
-> 1.02). Prompts that share nothing are spread the same way among the near-cheapest.

Branches: ``prefix_hit`` (the chosen worker has the longest match), ``load_fallback`` (a worker with a
longer match was passed over), ``load_balance`` (no match anywhere). Fallback: no candidate under the cap:
the lowest cost among all. Without ``ctx.latency`` (a bare policy) every worker has the prior's rates.
Knobs (``routing.policies.ttft``, ``TtftSettings`` in ``ttft_settings.py``; defaults): ``load_factor``
3.0 (a safety bound: the model prices load. Tighter, it forces moves the model would not make: at 2 the
holder in a closed loop, slower than its peers and so holding more of the clients, trips it, and each
forced copy thrashes caches that hold their share and no more (SIMULATED sweep: 68 of 120 cells at 2, 80
at 3); it also spreads hot prefixes the model keeps, so at 3 hot cells lose balance, docs/benchmarks.md),
``load_slack`` 2,
``prior_prefill_s_per_token`` 1e-4; and ``routing.trackers.attention_tokens``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from prefix_router.routing.backlog import prefill_work
from prefix_router.routing.policies.base import NoHooks, cap_of, load_totals
from prefix_router.routing.policies.prefix import delayed_requests
from prefix_router.routing.policies.ttft_settings import TtftSettings
from prefix_router.routing.types import (
    MAX_ESTIMATES,
    Branch,
    CandidateEstimate,
    Context,
    Decision,
    RouteRequest,
    WorkerSnapshot,
)

__all__ = ["TtftPolicy", "TtftSettings"]

# the new prefixes ``new_home`` remembers: each weighs 1 - 1 / HOMES_MEMORY less at each new one
HOMES_MEMORY = 32.0
# two workers' decayed counts closer than this are equal
HOMES_EPSILON = 1e-9


class TtftPolicy(NoHooks):
    def __init__(self, knobs: TtftSettings) -> None:
        self.load_factor = knobs.load_factor
        self.load_slack = knobs.load_slack
        rate = knobs.prior_prefill_s_per_token
        self.prior = (0.0, rate, rate, 0.0)
        self.homes: dict[str, float] = {}  # new prefixes placed lately, per worker (``new_home``)

    def on_worker_removed(self, worker: str) -> None:
        self.homes.pop(worker, None)

    def estimate(
        self, req: RouteRequest, w: WorkerSnapshot, ctx: Context, share: float, delayed: float, chain: float
    ) -> CandidateEstimate:
        """``w``'s predicted first-token time for ``req`` and its parts, in seconds (see the module doc);
        ``share``: the share of its cache in use (``occupancy``); ``delayed``: the requests that will queue
        behind a prefill placed now (``delayed_requests``); ``chain``: the recomputes one eviction sets off
        (``eviction_chain``)."""
        scale = ctx.token_scale
        prompt = req.key_tokens * scale
        cached = min(prompt, ctx.matches.get(w.name, 0) * req.block_tokens * scale)
        own = prefill_work(prompt - cached, cached, ctx.attention_tokens)
        latency = ctx.latency
        rates = self.prior if latency is None else latency.rates(w.name, self.prior)
        overhead, prefill_s, decode_s, queued_s = rates
        wait = overhead + prefill_s * w.prefill_backlog + queued_s * max(0, w.in_flight - w.decoding)
        prefill = prefill_s * own
        decode = decode_s * w.decoding
        cache = (
            prefill_s * evicted(prompt - cached, w.name, ctx, share) * (1.0 + delayed) * chain if own else 0.0
        )
        typical = ctx.request_work
        here = delayed_requests(w.prefill_backlog / typical) if typical > 0 else 0.0
        here = min(max(here, float(w.in_flight - w.decoding)), delayed)
        return CandidateEstimate(
            w.name, wait + prefill + decode, wait, prefill, decode, prefill * here, cache
        )

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        weight, flight, backlog = load_totals(workers)
        cap = cap_of(weight, flight, self.load_factor, self.load_slack)
        typical = ctx.request_work
        delayed = waiting_behind(workers, flight, backlog, typical)
        allowed = [w for w in workers if w.in_flight + 1 <= cap * w.weight] or list(workers)
        shares = {w.name: occupancy(w.name, ctx, w.kv_usage) for w in workers}
        chain = eviction_chain(shares.values())
        ranked: list[tuple[float, int, CandidateEstimate]] = []
        for i, w in enumerate(allowed):
            e = self.estimate(req, w, ctx, shares[w.name], delayed, chain)
            ranked.append((_cost(e), i, e))
        ranked.sort(key=_first)
        best = ranked[0][0]
        tied = [e for cost, _, e in ranked if cost == best]
        chosen = tied[0] if len(tied) == 1 else ctx.rng.choice(tied)
        longest = max((ctx.matches.get(w.name, 0) for w in workers), default=0)
        error = 1.0 if ctx.latency is None else min(1.0, ctx.latency.uncertainty())
        if longest > 0:
            chosen = _incumbent(ranked, chosen, ctx.matches, error)
        else:
            chosen = new_home(ranked, chosen, error, self.homes)
        return Decision(
            chosen.worker,
            _branch(ctx.matches.get(chosen.worker, 0), longest),
            predicted_ttft_s=chosen.ttft_s,
            estimates=tuple(e for _, _, e in ranked[:MAX_ESTIMATES]),
        )


def waiting_behind(workers: Sequence[WorkerSnapshot], flight: int, backlog: float, typical: float) -> float:
    """The requests a prefill placed now delays on a worker (``D``, the fleet's mean per worker): those
    queued behind it, counted by the prefill backlog in typical requests (``W / (1 - rho)``) or, where
    admission holds them, by the requests not past their first token; at most a worker's share of the
    requests in flight."""
    n = len(workers)
    by_work = delayed_requests(backlog / n / typical) if typical > 0 else 0.0
    queued = 0
    for w in workers:
        queued += w.in_flight - w.decoding
    return min(max(by_work, queued / n), flight / n)


def eviction_chain(shares: Collection[float]) -> float:
    """The recomputes one eviction sets off (``C``) in a fleet whose caches are ``shares`` full
    (``occupancy``): what it evicts is recomputed later where there is room, and where there is none it
    evicts in turn; with the roomiest cache a share ``f`` full, about ``1 / (1 - f)`` of them (1 + f + f^2
    ...), at most one per worker."""
    least = min(shares, default=0.0)
    n = float(len(shares))
    return n if least >= 1.0 - 1.0 / n else 1.0 / (1.0 - least)


def occupancy(worker: str, ctx: Context, kv_usage: float | None = None) -> float:
    """The share of ``worker``'s cache in use: the larger of the index's fill and the engine's scraped KV
    usage ``kv_usage`` (blocks its running requests hold, which the index may not count: their outputs, a
    prompt longer than its key)."""
    cache = ctx.cache
    fills = ctx.fills
    fill = fills.get(worker, 0.0) if fills is not None else cache.fill(worker) if cache is not None else 0.0
    return min(1.0, max(fill, kv_usage)) if kv_usage is not None else fill


def evicted(inserted: float, worker: str, ctx: Context, share: float) -> float:
    """The cached tokens that inserting ``inserted`` tokens on ``worker``, its cache a ``share`` in use
    (``occupancy``), costs: all of them beyond the room left there, and of those that fit, that share (the
    room is shared by whatever comes next: in a cache that full, about that share of it displaces
    something before it is reused); ``inserted x share`` where the capacity is unknown."""
    cache = ctx.cache
    capacity = cache.capacity_tokens(worker) * ctx.token_scale if cache is not None else 0.0
    if capacity <= 0.0:
        return inserted * share
    room = max(0.0, (1.0 - share) * capacity)
    return max(0.0, inserted - room) + min(inserted, room) * share


def new_home(
    ranked: list[tuple[float, int, CandidateEstimate]],
    chosen: CandidateEstimate,
    error: float,
    homes: dict[str, float],
) -> CandidateEstimate:
    """Where a prefix held nowhere goes: ``chosen`` (the cheapest of ``ranked``), or the candidate that
    took fewer new prefixes lately (``homes``; the fewest, then the cheaper) among those that the model's
    ``error`` cannot tell from it: cost and eviction cost both within ``1 + error`` of ``chosen``'s. The
    place is recorded in ``homes``: each new prefix weighs 1, and every weight is decayed by 1 - 1 /
    ``HOMES_MEMORY`` at each new one."""
    cost = _cost(chosen) * (1.0 + error)
    evicts = chosen.cache_s * (1.0 + error)
    fewest = homes.get(chosen.worker, 0.0) - HOMES_EPSILON
    for total, _, e in ranked:
        if total <= cost and e.cache_s <= evicts and homes.get(e.worker, 0.0) < fewest:
            chosen, fewest = e, homes.get(e.worker, 0.0) - HOMES_EPSILON
    keep = 1.0 - 1.0 / HOMES_MEMORY
    for worker in homes:
        homes[worker] *= keep
    homes[chosen.worker] = homes.get(chosen.worker, 0.0) + 1.0
    return chosen


def _incumbent(
    ranked: list[tuple[float, int, CandidateEstimate]],
    chosen: CandidateEstimate,
    matches: dict[str, int],
    error: float,
) -> CandidateEstimate:
    """The cheapest holder of the longest match among the candidates (the incumbent) unless ``chosen``
    is cheaper even with the predicted waits (its wait and decode parts) off by ``error`` (the model's
    recent median relative error) against it and for the incumbent: moving copies a prefix and evicts,
    which is known; the queue it avoids is a prediction."""
    longest = max((matches.get(e.worker, 0) for _, _, e in ranked), default=0)
    if longest <= 0 or matches.get(chosen.worker, 0) == longest:
        return chosen
    for _, _, e in ranked:
        if matches.get(e.worker, 0) == longest:
            return chosen if _bound(chosen, error) < _bound(e, -error) else e
    return chosen


def _cost(e: CandidateEstimate) -> float:
    """``e``'s cost, seconds: its first-token time, the delay it adds, the cache it evicts."""
    return e.ttft_s + e.added_s + e.cache_s


def _bound(e: CandidateEstimate, error: float) -> float:
    """``e``'s cost with its predicted waits scaled by 1 + ``error``."""
    return e.prefill_s + e.added_s + e.cache_s + (e.wait_s + e.decode_s) * (1.0 + error)


def _first(item: tuple[float, int, CandidateEstimate]) -> float:
    return item[0]


def _branch(matched: int, best: int) -> Branch:
    if best == 0:
        return Branch.LOAD_BALANCE
    return Branch.PREFIX_HIT if matched == best else Branch.LOAD_FALLBACK
