"""The metrics registry: Prometheus text, bounded label sets, forgetting removed workers."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from prefix_router.node.telemetry.metrics import CounterSet, FastHistogram, ProxyMetrics
from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.settings import WorkerSettings
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Branch, Decision, Outcome, RouteRequest


def metrics_with(*workers: str, router: Router | None = None) -> tuple[ProxyMetrics, WorkerPool]:
    pool_router = router or Router(RoutingSettings())
    pool = WorkerPool(pool_router, 8)
    for name in workers:
        pool.add(WorkerSettings(url=f"http://{name}:1", name=name))
    return ProxyMetrics(pool, pool_router), pool


def samples(metrics: ProxyMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_exposition_parses_and_counts() -> None:
    router = Router(RoutingSettings())
    metrics, _ = metrics_with("a", router=router)
    metrics.request_done("a", "m", "prefix", 200)
    metrics.request_done("a", "m", "prefix", 200)
    for value in (0.0005, 0.003, 7.0, 1000.0):
        metrics.latency.observe(value)
    router.dispatched(RouteRequest("r1", (), 16, 0, hash_key=0), Decision("a", Branch.LEAST_LOAD), 0.0)
    got = samples(metrics)
    labels = (("model", "m"), ("policy", "prefix"), ("status", "200"), ("worker", "a"))
    assert got[("prefix_router_requests_total", labels)] == 2
    assert got[("prefix_router_request_seconds_bucket", (("le", "0.001"),))] == 1
    assert got[("prefix_router_request_seconds_bucket", (("le", "10.0"),))] == 3
    assert got[("prefix_router_request_seconds_bucket", (("le", "+Inf"),))] == 4
    assert got[("prefix_router_request_seconds_count", ())] == 4
    assert got[("prefix_router_in_flight", (("worker", "a"),))] == 1


def test_label_sets_are_bounded() -> None:
    counter = CounterSet("c", "c", ("x",), max_series=3)
    for i in range(10):
        counter.inc((str(i),))
    counter.inc(("0",))
    assert len(counter.values) == 3 and counter.dropped == 7 and counter.get(("0",)) == 2


def test_removed_workers_are_forgotten() -> None:
    metrics, pool = metrics_with("a", "b")
    for worker in ("a", "b"):
        metrics.request_done(worker, "m", "random", 200)
        metrics.attempt_done(worker, 200)
        metrics.upstream_errors.inc((worker, "connect"))
    pool.remove("b")
    metrics.forget_worker("b")
    text = metrics.render().decode()
    assert 'worker="a"' in text and 'worker="b"' not in text


def test_histogram_edges() -> None:
    hist = FastHistogram("h", "h", (1.0, 2.0))
    for value in (1.0, 1.5, 2.0, 3.0):
        hist.observe(value)
    assert hist.counts == [1, 2, 1] and hist.count == 4 and hist.sum == 7.5


def test_other_processes_snapshots_are_added_at_scrape_time() -> None:
    """``serve --processes``: any process's /metrics counts every process's requests."""
    mine, _ = metrics_with("a")
    their_router = Router(RoutingSettings())
    theirs, _ = metrics_with("a", router=their_router)
    mine.request_done("a", "m", "prefix", 200)
    theirs.request_done("a", "m", "prefix", 200)
    theirs.request_done("a", "m", "prefix", 502)
    theirs.latency.observe(0.003)
    their_router.load.start("r1", "a", 0)  # one request in flight in the other process
    req = RouteRequest("r2", (1, 2), 16, 32, hash_key=1)
    their_router.dispatched(req, Decision("a", Branch.LEAST_LOAD), 0.0)
    their_router.finished(req, "a", Outcome(cached_tokens=16), 0.0)  # one cache report there
    mine.peers = lambda: [
        theirs.snapshot(),
        b"not json",
        b"[1]",
        b'{"counters": {"prefix_router_requests": 5}, "feedback": {"a": {"reports": "x"}}}',
    ]
    got = samples(mine)
    for status, count in (("200", 2), ("502", 1)):
        labels = (("model", "m"), ("policy", "prefix"), ("status", status), ("worker", "a"))
        assert got[("prefix_router_requests_total", labels)] == count
    assert got[("prefix_router_request_seconds_count", ())] == 1
    assert got[("prefix_router_in_flight", (("worker", "a"),))] == 1
    assert got[("prefix_router_cached_tokens_total", (("kind", "reported"), ("worker", "a")))] == 16


def test_predicted_vs_reported_counts_only_the_requests_whose_engine_reported() -> None:
    router = Router(RoutingSettings.model_validate({"keys": {"block_tokens": 16}}))
    metrics, _ = metrics_with("a", router=router)
    blocks = (1, 2, 3, 4)
    for i, cached in enumerate((None, None, 48, None, 10**308)):
        req = RouteRequest(f"r{i}", blocks, 16, 70, hash_key=1)
        decision = router.route(req, ["a"], float(i))
        router.dispatched(req, decision, float(i))
        router.first_token(req.route_id, float(i))
        router.finished(req, "a", Outcome(cached_tokens=cached), float(i))
    got = samples(metrics)
    # predicted 64 twice (two reports), 0 + 64 + 64 for the three unreported ones: not counted
    assert got[("prefix_router_cached_tokens_total", (("kind", "predicted"), ("worker", "a")))] == 128
    assert got[("prefix_router_cached_tokens_total", (("kind", "reported"), ("worker", "a")))] == 48 + 70
    assert got[("prefix_router_cache_reports_total", (("verdict", "unreported"), ("worker", "a")))] == 3
    assert got[("prefix_router_cache_reports_total", (("verdict", "agree"), ("worker", "a")))] == 2
    assert got[("prefix_router_cache_reports_clamped_total", (("worker", "a"),))] == 1
    assert got[("prefix_router_worker_capacity_tokens", (("kind", "learned"), ("worker", "a")))] == 1_000_000


def test_predicted_against_observed_first_token_time_per_worker() -> None:
    metrics, _ = metrics_with("a", "b")
    metrics.ttft_predicted("a", 0.1, 0.1)  # exact
    metrics.ttft_predicted("a", 0.2, 0.1)  # 100 % off
    metrics.ttft_predicted("b", 0.092, 0.1)  # 8 % off
    got = samples(metrics)
    bucket = "prefix_router_ttft_prediction_error_bucket"
    assert got[(bucket, (("le", "0.05"), ("worker", "a")))] == 1
    assert got[(bucket, (("le", "1.0"), ("worker", "a")))] == 2
    assert got[(bucket, (("le", "0.05"), ("worker", "b")))] == 0
    assert got[(bucket, (("le", "0.1"), ("worker", "b")))] == 1
    assert got[("prefix_router_ttft_prediction_error_count", (("worker", "a"),))] == 2
    sums = "prefix_router_ttft_prediction_seconds_total"
    assert abs(got[(sums, (("kind", "predicted"), ("worker", "a")))] - 0.3) < 1e-9
    assert abs(got[(sums, (("kind", "observed"), ("worker", "a")))] - 0.2) < 1e-9
    metrics.forget_worker("a")
    assert not [k for k in samples(metrics) if "ttft_prediction" in k[0] and ("worker", "a") in k[1]]


def test_the_prediction_error_series_are_bounded(monkeypatch: object) -> None:
    from prefix_router.node.telemetry import metrics as module

    setattr(module, "MAX_SERIES", 3)  # noqa: B010
    try:
        metrics, _ = metrics_with()
        for i in range(10):
            metrics.ttft_predicted(f"w{i}", 0.1, 0.2)
        assert len(metrics.ttft_error.series) == 3 and metrics.ttft_error.dropped == 7
    finally:
        setattr(module, "MAX_SERIES", 10_000)  # noqa: B010
