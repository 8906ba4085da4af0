"""The ``prefix`` policy's promises: the bounded-load cap binds, and a long prompt held by a worker at the
cap goes beyond it only as a cheap hit (held to ``hit_cap_share``, no more work left than the fleet's mean
request) and never beyond ``hit_cap_factor`` x the cap; the holder of a prefix is left only when its wait
clearly exceeds the recomputation."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefix_router.routing.backlog import prefill_work
from prefix_router.routing.policies import make_policy
from prefix_router.routing.policies.base import load_cap
from prefix_router.routing.policies.prefix import PrefixPolicy, PrefixSettings, delayed_requests
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Context, Outcome, RouteRequest, WorkerSnapshot

CFG = PrefixSettings()
LONG = 20_000  # tokens: recomputing this prompt costs far more than any in-flight penalty
BLOCKS = LONG // 16


def long_request(rid: str = "r") -> RouteRequest:
    return RouteRequest(rid, tuple(range(BLOCKS)), 16, LONG, 0)


def snaps(*in_flight: int) -> list[WorkerSnapshot]:
    return [WorkerSnapshot(f"w{i}", in_flight=n) for i, n in enumerate(in_flight)]


class Caches:
    """The index's view of the caches: every cache ``fill`` full."""

    def __init__(self, fill: float) -> None:
        self.level = fill

    def fill(self, worker: str) -> float:
        return self.level


def ctx(matches: dict[str, int], fill: float = 1.0, request_work: float = 0.0) -> Context:
    return Context(0.0, random.Random(0), matches, Caches(fill), request_work)


NO_HIT_CAP = PrefixSettings(hit_cap_factor=1.0)


def test_a_long_fully_matched_prompt_leaves_a_holder_at_the_cap_without_the_hit_cap() -> None:
    policy = make_policy("prefix", NO_HIT_CAP)
    workers = snaps(4, 0, 0, 0)
    assert workers[0].in_flight + 1 > load_cap(workers, CFG.load_factor, CFG.load_slack)  # at the cap
    d = policy.select(long_request(), workers, ctx({"w0": BLOCKS}, request_work=1_000))
    assert d.worker != "w0" and d.branch == "load_fallback"


def test_a_cheap_hit_stays_on_its_holder_above_the_cap_up_to_the_hit_cap() -> None:
    policy = make_policy("prefix")
    # cap = ceil(1.25 x 5 / 4) + 2 = 4: w0 is at it
    at_cap = snaps(4, 0, 0, 0)
    assert at_cap[0].in_flight + 1 > load_cap(at_cap, CFG.load_factor, CFG.load_slack)
    d = policy.select(long_request(), at_cap, ctx({"w0": BLOCKS}, request_work=1_000))
    assert (d.worker, d.branch) == ("w0", "prefix_hit")  # no work left: cheaper than any request
    # 13 in flight: cap ceil(1.25 x 14 / 4) + 2 = 7, hit cap 14: the 14th request is the last it takes
    below, at_hit_cap = snaps(13, 0, 0, 0), snaps(14, 0, 0, 0)
    assert below[0].in_flight + 1 == CFG.hit_cap_factor * load_cap(below, CFG.load_factor, CFG.load_slack)
    assert policy.select(long_request(), below, ctx({"w0": BLOCKS}, request_work=1_000)).worker == "w0"
    cap = load_cap(at_hit_cap, CFG.load_factor, CFG.load_slack)
    assert at_hit_cap[0].in_flight + 1 > CFG.hit_cap_factor * cap  # at the hit cap: never above it
    d = policy.select(long_request(), at_hit_cap, ctx({"w0": BLOCKS}, request_work=1_000))
    assert d.worker != "w0" and d.branch == "load_fallback"


def test_above_the_cap_only_a_hit_that_holds_the_prompt_and_leaves_little_work() -> None:
    policy = make_policy("prefix")
    workers = snaps(4, 0, 0, 0)
    # 80 % held (below hit_cap_share 0.9): 4,000 tokens left to compute, however cheap the fleet finds them
    partial = policy.select(long_request(), workers, ctx({"w0": BLOCKS * 8 // 10}, request_work=1e9))
    assert partial.worker != "w0"
    # 95 % held, but the 1,000 tokens left cost more than the fleet's mean request (500)
    costly = policy.select(long_request(), workers, ctx({"w0": BLOCKS * 95 // 100}, request_work=500))
    assert costly.worker != "w0"
    cheap = policy.select(long_request(), workers, ctx({"w0": BLOCKS * 95 // 100}, request_work=5_000))
    assert cheap.worker == "w0"


def test_the_cap_boundary_one_below_it_still_takes_the_request() -> None:
    policy = make_policy("prefix", NO_HIT_CAP)
    workers = snaps(3, 0, 0, 0)  # cap = ceil(1.25 x 4 / 4) + 2 = 4: the holder may take a 4th request
    assert workers[0].in_flight + 1 == load_cap(workers, CFG.load_factor, CFG.load_slack)
    d = policy.select(long_request(), workers, ctx({"w0": BLOCKS}))
    assert (d.worker, d.branch) == ("w0", "prefix_hit")


def test_the_holder_is_left_only_when_its_wait_exceeds_twice_the_recomputation() -> None:
    policy = make_policy("prefix")
    # recomputing 20,000 tokens elsewhere is 26,103 token-equivalents; x2 on a full cache
    stays = [WorkerSnapshot("w0", prefill_backlog=45_000), WorkerSnapshot("w1")]
    leaves = [WorkerSnapshot("w0", prefill_backlog=60_000), WorkerSnapshot("w1")]
    assert policy.select(long_request(), stays, ctx({"w0": BLOCKS})).worker == "w0"
    assert policy.select(long_request(), leaves, ctx({"w0": BLOCKS})).worker == "w1"


def test_requests_past_their_first_token_cost_what_decoding_penalty_tokens_says() -> None:
    """Three requests decoding on the holder of a 640-token hit, an idle worker beside it: by default they
    cost as much as three still before their first token (the hit moves either way); priced lower
    (``decoding_penalty_tokens`` 128: they share the steps, none is ahead of the new prefill) the hit
    stays, while three before their first token still send it to the idle worker."""
    req = RouteRequest("r", tuple(range(40)), 16, 640, 0)
    decoding = [WorkerSnapshot("w0", in_flight=3, decoding=3), WorkerSnapshot("w1")]
    waiting = [WorkerSnapshot("w0", in_flight=3), WorkerSnapshot("w1")]
    elsewhere = 2 * prefill_work(640, 0, 32_768)  # a full cache there: twice the recomputation
    assert 3 * 128 < elsewhere < 3 * CFG.in_flight_penalty_tokens == 3 * CFG.decoding_penalty_tokens
    default, cheaper = (
        make_policy("prefix"),
        make_policy("prefix", PrefixSettings(decoding_penalty_tokens=128)),
    )
    assert default.select(req, decoding, ctx({"w0": 40})).branch == "load_fallback"
    assert default.select(req, waiting, ctx({"w0": 40})).branch == "load_fallback"
    assert cheaper.select(req, decoding, ctx({"w0": 40})).branch == "prefix_hit"
    assert cheaper.select(req, waiting, ctx({"w0": 40})).branch == "load_fallback"


def test_a_cache_with_room_costs_only_the_recomputation() -> None:
    policy = make_policy("prefix")
    workers = [WorkerSnapshot("w0", prefill_backlog=45_000), WorkerSnapshot("w1")]
    assert policy.select(long_request(), workers, ctx({"w0": BLOCKS}, fill=0.0)).worker == "w1"


def test_a_saturated_fleet_sticks_harder() -> None:
    policy = make_policy("prefix")
    # the wait that made the holder lose above, but the fleet's backlog is three typical requests deep
    workers = [WorkerSnapshot("w0", prefill_backlog=60_000), WorkerSnapshot("w1")]
    saturated = ctx({"w0": BLOCKS}, request_work=10_000)
    assert policy.select(long_request(), workers, saturated).worker == "w0"
    plain = make_policy("prefix", PrefixSettings(saturation_weight=0.0))
    assert plain.select(long_request(), workers, saturated).worker == "w1"


def test_the_delayed_requests_grow_without_bound_with_the_queue() -> None:
    values = [delayed_requests(w) for w in (0.0, 0.5, 1.0, 2.0, 5.0, 10.0)]
    assert values[0] == 0.0 and values == sorted(values)
    assert values[1] == pytest.approx(1.0)  # rho = 0.5
    assert values[-1] > 10 * 10


@given(st.floats(min_value=1e-6, max_value=1e150, allow_nan=False))
def test_the_delayed_requests_stay_finite_and_match_the_queue_model(waiting: float) -> None:
    """W / (1 - rho) with rho the root of rho^2 = W (1 - rho): finite and exact to float precision for
    any queue a scrape or an accounting slip could report (the direct form divided by zero past ~3e8)."""
    delayed = delayed_requests(waiting)
    assert math.isfinite(delayed) and delayed >= waiting
    idle = waiting / delayed  # 1 - rho: the utilisation rho the value implies
    assert (1.0 - idle) ** 2 == pytest.approx(waiting * idle, rel=1e-9)


@pytest.mark.parametrize("hit_cap_factor", [1.0, 2.0])
@settings(max_examples=40, deadline=None)
@given(
    workers=st.integers(min_value=2, max_value=8),
    events=st.lists(
        st.tuples(st.booleans(), st.integers(min_value=0, max_value=10_000)), min_size=1, max_size=120
    ),
)
def test_no_worker_ever_exceeds_the_cap_under_one_hot_long_prefix(
    hit_cap_factor: float, workers: int, events: list[tuple[bool, int]]
) -> None:
    """Requests that all share one long prefix arrive and finish in any order: the worker chosen for each
    is under the bounded-load cap computed over every worker just before the decision, times the hit cap
    (the requests are cheap hits once the prefix is held: without the hit cap, under the cap itself)."""
    knobs = {"policies": {"prefix": {"hit_cap_factor": hit_cap_factor}}}
    router = Router(RoutingSettings.model_validate(knobs), rng=random.Random(1))
    names = [f"w{i}" for i in range(workers)]
    for name in names:
        router.add_worker(name)
    live: list[tuple[RouteRequest, str]] = []
    for step, (arrive, pick) in enumerate(events):
        if not arrive and live:
            done, worker = live.pop(pick % len(live))
            router.finished(done, worker, Outcome(True, LONG), float(step))
            continue
        req = RouteRequest(f"r{step}", tuple(range(BLOCKS)), 16, LONG + step, 0)
        before = router.load.snapshots(names, float(step))
        cap = load_cap(before, CFG.load_factor, CFG.load_slack)
        decision = router.route(req, names, float(step))
        chosen = next(s for s in before if s.name == decision.worker)
        limit = cap * hit_cap_factor
        assert chosen.in_flight + 1 <= limit, (decision, [s.in_flight for s in before], cap)
        router.dispatched(req, decision, float(step))
        live.append((req, decision.worker))


class Fills:
    """A cache view with a fill per worker."""

    def __init__(self, fills: dict[str, float]) -> None:
        self.fills = fills

    def fill(self, worker: str) -> float:
        return self.fills.get(worker, 0.0)


def reference_cheapest(
    policy: PrefixPolicy,
    req: RouteRequest,
    workers: list[WorkerSnapshot],
    ctx: Context,
    cap: float,
    base: float,
) -> tuple[list[str], int]:
    """The header's cost, worker by worker, nothing skipped: what ``cheapest`` must find."""
    prompt, block = req.key_tokens * ctx.token_scale, req.block_tokens * ctx.token_scale
    costs: list[tuple[float, str]] = []
    for w in workers:
        matched = ctx.matches.get(w.name, 0)
        cached = min(prompt, matched * block)
        work = prefill_work(prompt - cached, cached, ctx.attention_tokens)
        over = w.in_flight + 1 > cap * w.weight
        cheap_hit = (
            matched > 0
            and w.in_flight + 1 <= cap * policy.hit_cap_factor * w.weight
            and cached >= policy.hit_cap_share * prompt
            and work <= ctx.request_work
        )
        if over and not cheap_hit:
            continue
        fill = ctx.cache.fill(w.name) if ctx.cache is not None and work else 0.0
        factor = base + policy.recompute_weight * fill if ctx.cache is not None and work else base
        wait = w.prefill_backlog + w.queue_depth * policy.queue_penalty_tokens
        waiting, decoding = w.in_flight - w.decoding, w.decoding
        wait += waiting * policy.in_flight_penalty_tokens + decoding * policy.decoding_penalty_tokens
        costs.append(((wait + factor * work) / w.weight, w.name))
    best = min((cost for cost, _ in costs), default=math.inf)
    longest = max((ctx.matches.get(w.name, 0) for w in workers), default=0)
    return [name for cost, name in costs if cost == best], longest


WORKER = st.tuples(
    st.integers(min_value=0, max_value=6),  # in flight
    st.sampled_from([0.0, 0.0, 100.0, 1_000.0, 5_000.5, 20_000.0]),  # prefill backlog
    st.integers(min_value=0, max_value=2),  # engine queue
    st.sampled_from([1.0, 1.0, 1.0, 0.5, 2.0]),  # weight
    st.sampled_from([0.0, 0.0, 0.3, 1.0]),  # fill
    st.sampled_from([0, 0, 0, 0, 3, 20, 40]),  # matched blocks
    st.integers(min_value=0, max_value=6),  # of those in flight, past their first token (at most all)
)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(WORKER, min_size=1, max_size=12),
    prompt=st.integers(min_value=0, max_value=700),
    base=st.sampled_from([1.0, 1.5, 3.0]),
    request_work=st.sampled_from([0.0, 50.0, 400.0]),
    with_fills=st.booleans(),
)
def test_cheapest_finds_the_reference_costs_minimum(
    rows: list[tuple[int, float, int, float, float, int, int]],
    prompt: int,
    base: float,
    request_work: float,
    with_fills: bool,
) -> None:
    """``cheapest`` (one inlined pass that skips a cold worker whose cost with an empty cache already loses)
    ties exactly the workers of the lowest reference cost, in candidate order, and finds the longest match."""
    workers = [
        WorkerSnapshot(
            f"w{i}",
            weight=weight,
            in_flight=flight,
            prefill_backlog=backlog,
            queue_depth=queue,
            decoding=min(decoding, flight),
        )
        for i, (flight, backlog, queue, weight, _, _, decoding) in enumerate(rows)
    ]
    fills = {f"w{i}": row[4] for i, row in enumerate(rows)}
    matches = {f"w{i}": row[5] for i, row in enumerate(rows) if row[5]}
    req = RouteRequest("r", tuple(range(40)), 16, prompt, 0)
    context = Context(0.0, random.Random(0), matches, Fills(fills), request_work, 2_000.0, 1.0)
    if with_fills:
        context.fills = fills
    policy = PrefixPolicy(CFG)
    cap = load_cap(workers, CFG.load_factor, CFG.load_slack)
    tied, longest = policy.cheapest(req, workers, matches, cap, base, context)
    assert ([w.name for w in tied], longest) == reference_cheapest(policy, req, workers, context, cap, base)


def test_ties_are_broken_at_random_by_the_seeded_rng() -> None:
    """Equal costs (idle workers, nothing cached): each is chosen, about as often as the others, and the
    same seed gives the same choices (the aggregate Mooncake load-balance target was the only guard)."""
    policy = make_policy("prefix")
    workers = snaps(0, 0, 0, 0)
    req = RouteRequest("r", (1, 2, 3), 16, 48, 0)

    def picks(seed: int) -> list[str]:
        rng = random.Random(seed)
        return [policy.select(req, workers, Context(0.0, rng, {})).worker for _ in range(400)]

    counts = {name: picks(1).count(name) for name in ("w0", "w1", "w2", "w3")}
    assert all(70 <= n <= 130 for n in counts.values()), counts  # 100 each expected; binomial sd 8.7
    assert picks(7) == picks(7) and picks(7) != picks(8)


def test_a_cheaper_worker_is_never_left_to_the_tie_break() -> None:
    policy = make_policy("prefix")
    workers = snaps(1, 0, 1, 1)
    req = RouteRequest("r", (1, 2, 3), 16, 48, 0)
    chosen = {policy.select(req, workers, Context(0.0, random.Random(s), {})).worker for s in range(50)}
    assert chosen == {"w1"}
