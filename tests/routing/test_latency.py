"""The first-token model (routing/latency.py): calibration, outliers, bounds, reset; through the router."""

from __future__ import annotations

import math
import random

import pytest

from prefix_router.routing.latency import (
    CLIP,
    CLIP_AFTER,
    PRIOR_SAMPLES,
    WINDOW,
    LatencyModel,
    fit,
    predict,
    within_fleet,
)
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Decision, Outcome, RouteRequest

# a synthetic engine: 30 ms overhead, 1,000 tokens/s, 2 ms per decoding request, 5 ms per request queued
TRUE = (0.03, 1e-3, 2e-3, 5e-3)
PRIOR = (0.0, 1e-4, 1e-4, 0.0)  # ten times too fast, no admission wait


Rates = tuple[float, float, float, float]


def feed(model: LatencyModel, worker: str, n: int, seed: int, rates: Rates = TRUE) -> None:
    """``n`` requests of a seeded synthetic sequence, each observed at its engine's exact first-token time."""
    rng = random.Random(seed)
    now = 0.0
    for i in range(n):
        work, decoding, queued = rng.uniform(10, 3000), rng.randrange(0, 9), rng.randrange(0, 6)
        route_id = f"{worker}-{seed}-{i}"
        model.dispatched(route_id, worker, work, decoding, now, queued)
        model.observed(route_id, now + predict(rates, work, decoding, queued))
        now += 1.0


def test_the_prior_until_a_worker_has_samples() -> None:
    model = LatencyModel(100)
    assert model.rates("a", PRIOR) == PRIOR
    assert fit([0.0] * 21, PRIOR, 1.0) == PRIOR


def test_calibration_converges_to_the_engine_s_rates() -> None:
    model = LatencyModel(100)
    feed(model, "a", 3 * WINDOW, seed=1)
    got = model.rates("a", PRIOR)
    for learned, true in zip(got, TRUE, strict=True):
        assert learned == pytest.approx(true, rel=0.05)


def test_workers_are_calibrated_apart() -> None:
    model = LatencyModel(100)
    slow = (0.05, 4e-3, 1e-3, 0.0)
    feed(model, "a", 2 * WINDOW, seed=2)
    feed(model, "b", 2 * WINDOW, seed=3, rates=slow)
    # each pulled towards the pooled fleet's by two samples' weight: within 10 % of its own
    assert model.rates("a", PRIOR)[1] == pytest.approx(TRUE[1], rel=0.1)
    assert model.rates("b", PRIOR)[1] == pytest.approx(slow[1], rel=0.1)


def test_it_follows_an_engine_that_changes() -> None:
    model = LatencyModel(100)
    feed(model, "a", 2 * WINDOW, seed=4, rates=(0.0, 1e-3, 1e-3, 0.0))
    # clipped to 4x per sample: it gets there
    feed(model, "a", 4 * WINDOW, seed=5, rates=(0.0, 2e-3, 1e-3, 0.0))
    assert model.rates("a", PRIOR)[1] == pytest.approx(2e-3, rel=0.05)


def test_an_outlier_moves_the_fit_by_a_bounded_amount() -> None:
    model = LatencyModel(100)
    feed(model, "a", WINDOW, seed=6)
    before = predict(model.rates("a", PRIOR), 1000, 2)
    model.dispatched("slow", "a", 1000, 2, 0.0)
    model.observed("slow", 3600.0)  # an hour: a stalled stream, not the engine's rate
    after = predict(model.rates("a", PRIOR), 1000, 2)
    assert before < after < before * 1.2


def test_rates_are_never_negative() -> None:
    model = LatencyModel(100)
    for i in range(2 * CLIP_AFTER):  # more decoding, faster: a negative slope in the data
        model.dispatched(str(i), "a", 100.0, i, 0.0)
        model.observed(str(i), 1.0 - 0.01 * i)
    assert all(rate >= 0.0 for rate in model.rates("a", PRIOR))


def test_memory_stays_bounded() -> None:
    model = LatencyModel(16)
    feed(model, "a", 5 * WINDOW, seed=7)
    assert model.samples("a") == WINDOW
    for i in range(100):  # dispatched, never observed: the table of records keeps 16
        model.dispatched(str(i), "a", 1.0, 0, 0.0)
    assert model.pending() == 16


def test_forget_resets_a_worker() -> None:
    model = LatencyModel(100)
    feed(model, "a", WINDOW, seed=8)
    feed(model, "b", WINDOW, seed=9)
    model.dispatched("x", "a", 10.0, 0, 0.0)
    model.forget("a")
    assert model.samples("a") == 0 and model.pending() == 0
    assert model.rates("a", PRIOR) == model.fleet(PRIOR)  # b's now: a restarted engine looks like its peers
    assert model.fleet(PRIOR)[1] == pytest.approx(TRUE[1], rel=0.05)
    model.observed("x", 1.0)  # its record went with it: no sample
    assert model.samples("a") == 0
    assert model.samples("b") >= WINDOW - 2  # a served worker keeps about its window
    model.forget("b")
    assert model.rates("a", PRIOR) == PRIOR  # no worker has samples: the prior


def test_a_worker_without_samples_starts_from_the_fleet_s_rates() -> None:
    model = LatencyModel(100)
    feed(model, "a", WINDOW, seed=10)
    assert model.rates("new", PRIOR) == pytest.approx(model.rates("a", PRIOR), rel=0.01)


def _route(router: Router, i: int, now: float) -> tuple[RouteRequest, Decision]:
    req = RouteRequest(f"r{i}", tuple(range(1, 9)), 16, 128, 1)
    decision = router.route(req, ["a"], now)
    router.dispatched(req, decision, now)
    return req, decision


def test_the_router_learns_from_first_tokens_and_forgets_on_restart() -> None:
    router = Router(RoutingSettings(policy="ttft"), random.Random(0))
    router.add_worker("a", capacity_tokens=10_000)
    now = 0.0
    for i in range(CLIP_AFTER):
        req, decision = _route(router, i, now)
        router.first_token(req.route_id, now + 0.5)
        router.finished(req, decision.worker, Outcome(), now + 0.6)
        now += 1.0
    assert router.latency.samples("a") == CLIP_AFTER
    req, decision = _route(router, 99, now)
    router.finished(req, decision.worker, Outcome(ok=False), now + 0.1)  # no first token: no sample
    assert router.latency.samples("a") == CLIP_AFTER and router.latency.pending() == 0
    router.forget_cache("a")
    assert router.latency.samples("a") == 0
    _route(router, 100, now)
    router.remove_worker("a")
    assert router.latency.pending() == 0


def test_a_router_whose_policies_never_read_the_model_records_nothing() -> None:
    router = Router(RoutingSettings(policy="prefix"), random.Random(0))
    router.add_worker("a", capacity_tokens=10_000)
    req, _ = _route(router, 0, 0.0)
    router.first_token(req.route_id, 0.5)
    assert router.latency.pending() == 0 and router.latency.samples("a") == 0


def test_a_measured_prefill_rate_is_used_as_it_is_and_the_rest_fitted_around_it() -> None:
    """The prefill rate measured apart (the backlog's drain) is not refitted: requests queued ahead grow
    with the work ahead, and a free fit may trade one for the other."""
    model = LatencyModel(100, drain=lambda: 1000.0)
    feed(model, "a", 2 * WINDOW, seed=11)
    rates = model.rates("a", PRIOR)
    assert rates[1] == 1e-3
    for learned, true in zip(rates, TRUE, strict=True):
        assert learned == pytest.approx(true, rel=0.05)


def test_a_worker_s_cost_per_decoding_request_stays_within_clip_times_the_fleet_s() -> None:
    """Waits one worker's features do not explain (here 25x its peers' cost per decoding request) price it
    at most ``CLIP`` x the fleet's rate, not at its own fit's."""
    model = LatencyModel(1000)
    for i in range(3):
        feed(model, f"peer{i}", 2 * WINDOW, seed=20 + i)
    feed(model, "d", 2 * WINDOW, seed=40, rates=(0.03, 1e-3, 0.05, 5e-3))
    fleet = model.fleet(PRIOR)
    own = fit(model._workers["d"].sums, fleet, PRIOR_SAMPLES)  # what its samples alone say
    assert own[2] > CLIP * fleet[2]
    assert model.rates("d", PRIOR)[2] == pytest.approx(CLIP * fleet[2])
    assert model.rates("d", PRIOR)[1] == pytest.approx(1e-3, rel=0.05)  # within the bound: its own
    assert model.rates("peer0", PRIOR)[2] < fleet[2]


def test_only_the_cost_per_decoding_request_is_bounded_and_only_by_a_fleet_s_rate_above_0() -> None:
    assert within_fleet((1.0, 1.0, 1.0, 1.0), (0.1, 0.1, 0.1, 0.1)) == (1.0, 1.0, pytest.approx(0.4), 1.0)
    assert within_fleet((1.0, 1.0, 1.0, 1.0), (0.1, 0.1, 0.0, 0.1)) == (1.0, 1.0, 1.0, 1.0)


def test_admission_waits_are_learned_per_request_queued_ahead() -> None:
    model = LatencyModel(100)
    feed(model, "a", 2 * WINDOW, seed=12, rates=(0.03, 1e-3, 2e-3, 0.2))  # a full engine: 200 ms a slot
    feed(model, "b", 2 * WINDOW, seed=13, rates=(0.03, 1e-3, 2e-3, 0.0))  # never full
    assert model.rates("a", PRIOR)[3] == pytest.approx(0.2, rel=0.1)
    assert model.rates("b", PRIOR)[3] < 0.02


def test_a_request_sent_after_its_dispatch_is_timed_from_its_sending() -> None:
    # a decode stage reserved at the two-stage choice: the prefill stage's time is not its engine's
    waited, timed = LatencyModel(100), LatencyModel(100)
    rng = random.Random(4)
    for i in range(3 * WINDOW):
        work, decoding = rng.uniform(10, 3000), rng.randrange(0, 9)
        for model in (waited, timed):
            model.dispatched(f"r{i}", "a", work, decoding, 0.0)
        timed.sent(f"r{i}", 5.0)  # the prefill took 5 s
        waited.observed(f"r{i}", 5.0 + predict(TRUE, work, decoding, 0))
        timed.observed(f"r{i}", 5.0 + predict(TRUE, work, decoding, 0))
    timed.sent("unknown", 1.0)  # ignored
    for learned, true in zip(timed.rates("a", PRIOR)[:3], TRUE[:3], strict=True):  # none queued ahead
        assert learned == pytest.approx(true, rel=0.05)
    assert waited.rates("a", PRIOR)[0] > 1.0  # without it the prefill's wait reads as the engine's overhead


def test_a_worker_that_stops_getting_requests_returns_to_the_fleet_s_rates() -> None:
    """Samples older than the fleet takes to renew a window (the median span of the full windows) are
    dropped: a worker fitted slow, then avoided, does not keep that fit forever."""
    model = LatencyModel(1000)
    slow = (0.5, 1e-3, 2e-3, 0.0)
    now = 0.0
    for i in range(WINDOW):
        for worker, rates in (("a", slow), ("b", TRUE), ("c", TRUE)):
            model.dispatched(f"{worker}{i}", worker, 1000.0, 2, now)
            model.observed(f"{worker}{i}", now + predict(rates, 1000.0, 2))
            now += 1.0
    assert model.rates("a", PRIOR)[0] > 0.3
    for i in range(WINDOW, 4 * WINDOW):  # only b and c get requests now
        for worker in ("b", "c"):
            model.dispatched(f"{worker}{i}", worker, 1000.0, 2, now)
            model.observed(f"{worker}{i}", now + predict(TRUE, 1000.0, 2))
            now += 1.0
    assert model.samples("a") == 0
    assert model.rates("a", PRIOR) == model.fleet(PRIOR)
    assert model.samples("b") >= WINDOW - 2  # a served worker keeps about its window


def test_a_worker_not_yet_sampled_is_priced_at_the_measured_prefill_rate() -> None:
    """Its peers' prefill is priced at the fleet's measured rate: so is its own, not at the prior (10x
    too fast here), which would make it look faster or slower than its peers for every new prefix."""
    model = LatencyModel(100, drain=lambda: 1000.0)
    feed(model, "a", 3, seed=12)
    assert model.rates("a", PRIOR)[1] == 1e-3
    assert model.rates("new", PRIOR)[1] == 1e-3


def test_the_fleet_follows_every_sample_until_it_has_a_few() -> None:
    """Before ``FLEET_EVERY`` samples the fleet's fit is not held at the prior: a worker not yet sampled
    starts from what the first samples taught."""
    model = LatencyModel(100)
    feed(model, "a", 3, seed=13)
    first = model.rates("new", PRIOR)
    assert first != PRIOR
    feed(model, "a", 1, seed=14)
    assert model.rates("new", PRIOR) != first


def test_uncertainty_is_the_recent_median_error_of_predictions_made_before_learning() -> None:
    """No trust (1.0) until a few first tokens were predicted; then the median of |predicted - observed|
    / observed, each predicted before its sample was learned: an engine the model has learned scores
    near 0, one whose times are noise keeps a large error."""
    model = LatencyModel(1000)
    assert model.uncertainty() == 1.0
    model.rates("a", PRIOR)  # read by a policy: predictions are scored from now on
    feed(model, "a", CLIP_AFTER - 1, seed=15)
    assert model.uncertainty() == 1.0
    feed(model, "a", 2 * WINDOW, seed=16)
    assert model.uncertainty() < 0.01
    noisy = LatencyModel(1000)
    noisy.rates("a", PRIOR)
    rng = random.Random(17)
    for i in range(2 * WINDOW):
        noisy.dispatched(f"n{i}", "a", rng.uniform(10, 3000), 0, float(i), 0)
        noisy.observed(f"n{i}", float(i) + rng.uniform(0.05, 3.0))
    assert noisy.uncertainty() > 0.3


def test_uncertainty_counts_nothing_for_a_model_no_policy_reads() -> None:
    model = LatencyModel(1000)
    feed(model, "a", WINDOW, seed=18)
    assert model.uncertainty() == 1.0


def test_the_fit_minimises_the_relative_error_so_the_typical_request_is_predicted_well() -> None:
    # an engine whose long requests take 3x what a line through its short ones says (queueing in its steps):
    # a line cannot fit both; the relative fit keeps the typical, short request's time, where plain least
    # squares tilts the line towards the few long ones (its median error on the short ones: 132 %)
    model = LatencyModel(100)
    rng = random.Random(13)
    for i in range(WINDOW):
        long = i % 8 == 0
        work = rng.uniform(5000, 8000) if long else rng.uniform(10, 200)
        seconds = predict(TRUE, work, 0) * (3.0 if long else 1.0)
        model.dispatched(str(i), "a", work, 0, float(i))
        model.observed(str(i), float(i) + seconds)
    rates = model.rates("a", PRIOR)
    short = range(10, 200, 10)
    errors = sorted(abs(predict(rates, w, 0) - predict(TRUE, w, 0)) / predict(TRUE, w, 0) for w in short)
    assert errors[len(errors) // 2] < 0.1


def test_a_vanishing_first_token_time_weighs_as_the_floor() -> None:
    model = LatencyModel(100)
    feed(model, "a", WINDOW, seed=14)
    before = model.rates("a", PRIOR)
    model.dispatched("instant", "a", 1000.0, 2, 0.0)
    model.observed("instant", 0.0)  # a first token at its own dispatch time: kept, weighted as FLOOR_S
    after = model.rates("a", PRIOR)
    assert all(math.isfinite(rate) for rate in after)
    assert predict(after, 1000, 2) > 0.5 * predict(before, 1000, 2)


def test_noise_it_cannot_explain_does_not_pull_the_fit_below_the_typical_time() -> None:
    # every request's time is the engine's line x 0.5, 1 or 2 in turn (what no feature tells apart, as the
    # co-batched requests sent after it on a real engine): weighted by the observed time alone (1 / y^2)
    # the fit lands at 0.64 of the typical time (2/3 for a constant), by the observed and predicted times
    # (1 / (y x predicted)) at 0.81 (their harmonic mean, 6/7, for a constant)
    model = LatencyModel(100)
    rng = random.Random(15)
    for i in range(4 * WINDOW):
        work, decoding = rng.uniform(10, 3000), rng.randrange(0, 9)
        model.rates("a", PRIOR)  # a policy reads the model at each decision
        model.dispatched(str(i), "a", work, decoding, float(i))
        model.observed(str(i), float(i) + predict(TRUE, work, decoding) * (0.5, 1.0, 2.0)[i % 3])
    rates = model.rates("a", PRIOR)
    ratios = sorted(predict(rates, w, 4) / predict(TRUE, w, 4) for w in range(100, 3000, 100))
    assert ratios[len(ratios) // 2] > 0.75
