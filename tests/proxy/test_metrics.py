"""The metrics registry: Prometheus text, bounded label sets, forgetting removed workers."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.settings import WorkerConfig
from prefix_router.proxy.metrics import CounterSet, FastHistogram, ProxyMetrics
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Decision, RouteRequest


def metrics_with(*workers: str, router: Router | None = None) -> tuple[ProxyMetrics, WorkerPool]:
    pool = WorkerPool(router or Router(RoutingSettings()), 8)
    for name in workers:
        pool.add(WorkerConfig(url=f"http://{name}:1", name=name))
    return ProxyMetrics(pool), pool


def samples(metrics: ProxyMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_exposition_parses_and_counts() -> None:
    router = Router(RoutingSettings())
    metrics, _ = metrics_with("a", router=router)
    metrics.request_done("a", "prefix", 200)
    metrics.request_done("a", "prefix", 200)
    metrics.cached_tokens("a", predicted=100, actual=80)
    for value in (0.0005, 0.003, 7.0, 1000.0):
        metrics.latency.observe(value)
    router.dispatched(RouteRequest("r1", (), 16, 0, hash_key=0), Decision("a", "test"), 0.0)
    got = samples(metrics)
    labels = (("policy", "prefix"), ("status", "200"), ("worker", "a"))
    assert got[("prefix_router_requests_total", labels)] == 2
    assert got[("prefix_router_cached_tokens_total", (("kind", "actual"), ("worker", "a")))] == 80
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
        metrics.request_done(worker, "random", 200)
        metrics.cached_tokens(worker, 1, 1)
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
    mine.request_done("a", "prefix", 200)
    theirs.request_done("a", "prefix", 200)
    theirs.request_done("a", "prefix", 502)
    theirs.latency.observe(0.003)
    their_router.load.start("r1", "a", 0)  # one request in flight in the other process
    mine.peers = lambda: [
        theirs.snapshot(),
        b"not json",
        b"[1]",
        b'{"counters": {"prefix_router_requests": 5}}',
    ]
    got = samples(mine)
    key = (("policy", "prefix"), ("status", "200"), ("worker", "a"))
    assert got[("prefix_router_requests_total", key)] == 2
    assert (
        got[("prefix_router_requests_total", (("policy", "prefix"), ("status", "502"), ("worker", "a")))] == 1
    )
    assert got[("prefix_router_request_seconds_count", ())] == 1
    assert got[("prefix_router_in_flight", (("worker", "a"),))] == 1
