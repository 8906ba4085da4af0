"""Prometheus metrics of one router app (its own registry: no global state).

The hot path only bumps plain numbers in bounded dicts (prometheus-client's labelled metrics cost the
router tens of microseconds per request, measured by ``bench-overhead``); the Prometheus families are
built when ``/metrics`` is scraped. Every labelled metric holds at most ``max_series`` label sets.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from prefix_router.pool.pool import WorkerPool

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TOKEN_BUCKETS = (0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)
MAX_SERIES = 10_000

Labels = tuple[str, ...]


class CounterSet:
    """A labelled counter: ``{label values: total}``, bounded (new label sets beyond the cap are dropped)."""

    def __init__(
        self, name: str, doc: str, labels: tuple[str, ...] = (), max_series: int = MAX_SERIES
    ) -> None:
        self.name, self.doc, self.labels, self.max_series = name, doc, labels, max_series
        self.values: dict[Labels, float] = {}
        self.dropped = 0

    def inc(self, key: Labels = (), amount: float = 1.0) -> None:
        value = self.values.get(key)
        if value is not None:
            self.values[key] = value + amount
        elif len(self.values) < self.max_series:
            self.values[key] = amount
        else:
            self.dropped += 1

    def get(self, key: Labels = ()) -> float:
        return self.values.get(key, 0.0)

    def forget(self, position: int, value: str) -> None:
        """Drop every series whose label at ``position`` equals ``value``."""
        for key in [k for k in self.values if k[position] == value]:
            del self.values[key]

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.doc, labels=list(self.labels))
        for key, value in self.values.items():
            family.add_metric(list(key), value)
        return family


class FastHistogram:
    """An unlabelled histogram: bucket counts and a sum, exposed cumulatively."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self.name, self.doc = name, doc
        self.bounds = list(buckets)
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def family(self) -> Metric:
        cumulative, running = [], 0
        for bound, n in zip([*map(_bound, self.bounds), "+Inf"], self.counts, strict=True):
            running += n
            cumulative.append((bound, float(running)))
        return HistogramMetricFamily(self.name, self.doc, buckets=cumulative, sum_value=self.sum)


def _bound(value: float) -> str:
    return str(float(value))


class ProxyMetrics(Collector):
    """Everything the proxy counts, plus per-worker gauges read from the pool at scrape time."""

    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool
        self.requests = CounterSet(
            "prefix_router_requests",
            "Client requests (not attempts) by the status the client got, the worker that answered, the model"
            " and the routing policy",
            ("worker", "model", "policy", "status"),
        )
        self.attempts = CounterSet(
            "prefix_router_upstream_attempts", "Upstream attempts by worker and status", ("worker", "status")
        )
        self.branches = CounterSet("prefix_router_route_branch", "Routing branch taken", ("policy", "branch"))
        self.cached = CounterSet(
            "prefix_router_cached_tokens",
            "Cached prompt tokens: predicted, engine-reported",
            ("worker", "kind"),
        )
        self.upstream_errors = CounterSet(
            "prefix_router_upstream_errors", "Failed exchanges", ("worker", "kind")
        )
        self.rejected = CounterSet("prefix_router_rejected", "Requests refused by the router", ("status",))
        self.retries = CounterSet("prefix_router_retries", "Attempts retried on another worker")
        self.record_dropped = CounterSet("prefix_router_record_dropped", "Trace lines dropped (caps)")
        self.predicted = FastHistogram(
            "prefix_router_predicted_prefix_tokens", "Predicted cached tokens", TOKEN_BUCKETS
        )
        self.ttft = FastHistogram(
            "prefix_router_ttft_seconds", "Time to first byte from the worker", LATENCY_BUCKETS
        )
        self.latency = FastHistogram(
            "prefix_router_request_seconds", "Total request latency", LATENCY_BUCKETS
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_open_fds, ...

    def attempt_done(self, worker: str, status: int) -> None:
        """One upstream attempt ended (a retried request makes several)."""
        self.attempts.inc((worker, str(status)))

    def request_done(self, worker: str, model: str, policy: str, status: int) -> None:
        """One client request ended with ``status``: counted once, however many attempts it took."""
        self.requests.inc((worker, model, policy, str(status)))

    def cached_tokens(self, worker: str, predicted: int, actual: int | None) -> None:
        self.cached.inc((worker, "predicted"), predicted)
        if actual is not None:
            self.cached.inc((worker, "actual"), actual)
            self.cached.inc((worker, "predicted_when_reported"), predicted)

    def forget_worker(self, worker: str) -> None:
        """Drop a removed worker's series so the registry stays bounded by the live pool."""
        for counter in (self.requests, self.attempts, self.cached, self.upstream_errors):
            counter.forget(0, worker)

    def collect(self) -> Iterator[Metric]:
        for counter in (self.requests, self.attempts, self.branches, self.cached, self.upstream_errors,
                        self.rejected, self.retries, self.record_dropped):  # fmt: skip
            yield counter.family()
        for histogram in (self.predicted, self.ttft, self.latency):
            yield histogram.family()
        yield from self._pool_gauges()

    def _pool_gauges(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily("prefix_router_in_flight", "Requests in flight", labels=["worker"])
        healthy = GaugeMetricFamily("prefix_router_worker_healthy", "1 when healthy", labels=["worker"])
        draining = GaugeMetricFamily("prefix_router_worker_draining", "1 when draining", labels=["worker"])
        for w in self._pool:
            in_flight.add_metric([w.name], self._pool.in_flight(w.name))
            healthy.add_metric([w.name], 1.0 if w.health.healthy else 0.0)
            draining.add_metric([w.name], 1.0 if w.draining else 0.0)
        yield from (in_flight, healthy, draining)

    def render(self) -> bytes:
        return generate_latest(self.registry)
