"""Prometheus metrics of one router app (its own registry: no global state).

The hot path only bumps plain numbers in bounded dicts (prometheus-client's labelled metrics cost the
router tens of microseconds per request, measured by ``bench-overhead``); the Prometheus families are
built when ``/metrics`` is scraped. Every labelled metric holds at most ``max_series`` label sets.
Predicted vs reported cached tokens are read from the routing core's own tallies at scrape time
(``Router.feedback``: one set of numbers for ``/metrics`` and ``/admin/routing``, bounded by the workers).
Under ``serve --processes`` each process sends ``snapshot()`` to the others once a second, and every scrape
adds the others' latest counters, histograms, in-flight counts and cache-report tallies (``peers``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from prefix_router.pool import WorkerPool
from prefix_router.routing import FeedbackStats, Router, Verdict

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

    def family(self, others: Iterable[list[list[Any]]] = ()) -> Metric:
        """The Prometheus family, with other processes' series (``snapshot`` lists) added in."""
        values = dict(self.values)
        for series in others:
            for labels, value in series:
                key = tuple(str(v) for v in labels)
                if len(key) == len(self.labels) and isinstance(value, int | float):
                    values[key] = values.get(key, 0.0) + value
        family = CounterMetricFamily(self.name, self.doc, labels=list(self.labels))
        for key, value in values.items():
            family.add_metric(list(key), value)
        return family

    def snapshot(self) -> list[list[Any]]:
        return [[list(key), value] for key, value in self.values.items()]


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

    def family(self, others: Iterable[dict[str, Any]] = ()) -> Metric:
        """The Prometheus family, with other processes' counts (``snapshot`` dicts) added in."""
        counts, total = list(self.counts), self.sum
        for other in others:
            theirs = other.get("counts")
            if isinstance(theirs, list) and len(theirs) == len(counts):
                counts = [a + int(b) for a, b in zip(counts, theirs, strict=True)]
                total += float(other.get("sum", 0.0))
        cumulative, running = [], 0
        for bound, n in zip([*map(_bound, self.bounds), "+Inf"], counts, strict=True):
            running += n
            cumulative.append((bound, float(running)))
        return HistogramMetricFamily(self.name, self.doc, buckets=cumulative, sum_value=total)

    def snapshot(self) -> dict[str, Any]:
        return {"counts": self.counts, "sum": self.sum}


def _part(snapshot: dict[str, Any], section: str, name: str, kind: type) -> Any:
    """``snapshot[section][name]`` when it is a ``kind``, else an empty one (a bad snapshot adds nothing)."""
    table = snapshot.get(section)
    value = table.get(name) if isinstance(table, dict) else None
    return value if isinstance(value, kind) and not isinstance(value, bool) else kind()


def _count(value: Any) -> int:
    return max(0, value) if isinstance(value, int) and not isinstance(value, bool) else 0


def _bound(value: float) -> str:
    return str(float(value))


class ProxyMetrics:
    """Everything the node counts, plus per-worker gauges read from the pool at scrape time: a
    prometheus ``Collector`` by its method (``collect``), not by its base, so that the compiled build makes
    it a native class (the request path reads its counters without a dictionary lookup)."""

    def __init__(self, pool: WorkerPool, router: Router) -> None:
        self._pool = pool
        self._router = router
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
        # prefill/decode disaggregation (docs/disaggregation.md)
        self.pd_requests = CounterSet(
            "prefix_router_pd_requests",
            "Requests of a fleet with prefill workers by how they ran: mode=split (a prefill stage, then the"
            " decode), or why the prefill stage was skipped (decode_holds_prefix, no_prefill_worker,"
            " no_decode_worker, prefill_failed)",
            ("mode",),
        )
        self.pd_prefill = FastHistogram(
            "prefix_router_pd_prefill_seconds",
            "Prefill stage: from its dispatch to its whole answer (a successful attempt)",
            LATENCY_BUCKETS,
        )
        self.pd_decode_ttft = FastHistogram(
            "prefix_router_pd_decode_ttft_seconds",
            "Decode stage: from the prefill's answer (its dispatch when there was no prefill stage) to the"
            " decode worker's first byte, i.e. the KV handoff (transfer or load) and the first decode step",
            LATENCY_BUCKETS,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        collector: Any = self  # a ``Collector`` by its method
        self.registry.register(collector)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_open_fds, ...
        # other serving processes' latest snapshots (``serve --processes``), added in at scrape time
        self.peers: Callable[[], list[bytes]] = list

    def _counters(self) -> tuple[CounterSet, ...]:
        return (self.requests, self.attempts, self.branches, self.upstream_errors, self.rejected,
                self.retries, self.record_dropped, self.pd_requests)  # fmt: skip

    def _histograms(self) -> tuple[FastHistogram, ...]:
        return (self.predicted, self.ttft, self.latency, self.pd_prefill, self.pd_decode_ttft)

    def snapshot(self) -> bytes:
        """This process's counters, histograms, in-flight counts and cache-report tallies, for the other
        processes' scrapes."""
        return orjson.dumps(
            {
                "counters": {c.name: c.snapshot() for c in self._counters()},
                "histograms": {h.name: h.snapshot() for h in self._histograms()},
                "in_flight": {w.name: self._pool.in_flight(w.name) for w in self._pool},
                "feedback": {w: dataclasses.asdict(f) for w, f in list(self._router.feedback.items())},
            }
        )

    def _peer_snapshots(self) -> list[dict[str, Any]]:
        out = []
        for raw in self.peers():
            with contextlib.suppress(orjson.JSONDecodeError):
                data = orjson.loads(raw)
                if isinstance(data, dict):
                    out.append(data)
        return out

    def attempt_done(self, worker: str, status: int) -> None:
        """One upstream attempt ended (a retried request makes several)."""
        self.attempts.inc((worker, str(status)))

    def request_done(self, worker: str, model: str, policy: str, status: int) -> None:
        """One client request ended with ``status``: counted once, however many attempts it took."""
        self.requests.inc((worker, model, policy, str(status)))

    def forget_worker(self, worker: str) -> None:
        """Drop a removed worker's series so the registry stays bounded by the live pool."""
        for counter in (self.requests, self.attempts, self.upstream_errors):
            counter.forget(0, worker)

    def collect(self) -> Iterator[Metric]:
        peers = self._peer_snapshots()
        for counter in self._counters():
            yield counter.family(_part(p, "counters", counter.name, list) for p in peers)
        for histogram in self._histograms():
            yield histogram.family(_part(p, "histograms", histogram.name, dict) for p in peers)
        yield from self._pool_gauges(peers)
        yield from self._feedback(peers)
        yield from self._units()  # this process's (with --processes, each learns every process's reports)

    def _feedback(self, peers: list[dict[str, Any]]) -> Iterator[Metric]:
        """Predicted vs engine-reported cached tokens per worker (the routing core's tallies)."""
        tokens = CounterMetricFamily(
            "prefix_router_cached_tokens",
            "Cached prompt tokens of the routed requests whose engine reported a count (the others are "
            "not counted: see verdict=unreported): kind=predicted, the router's prediction at dispatch; "
            "kind=reported, the engine's report clamped to the prompt",
            labels=["worker", "kind"],
        )
        reports = CounterMetricFamily(
            "prefix_router_cache_reports",
            "Engine cache reports of routed requests by verdict: agree, miss (the engine held less than "
            "predicted), over (more), raced (short, dispatched during its prefix's first prefill: "
            "ignored), queued (short, explained by its wait in the engine's queue: ignored), unreported (the "
            "response carried no count)",
            labels=["worker", "verdict"],
        )
        clamped = CounterMetricFamily(
            "prefix_router_cache_reports_clamped",
            "Engine cache reports outside [0, prompt tokens]",
            labels=["worker"],
        )
        capacity = GaugeMetricFamily(
            "prefix_router_worker_capacity_tokens",
            "KV-cache tokens the index keeps per worker: kind=known (configured or scraped), kind=learned "
            "(from engine reports, at most the known)",
            labels=["worker", "kind"],
        )
        index = self._router.index
        for worker, stats in list(self._router.feedback.items()):
            stats = _with_peers(stats, worker, peers)
            tokens.add_metric([worker, "predicted"], stats.predicted_tokens)
            tokens.add_metric([worker, "reported"], stats.reported_tokens)
            for verdict in Verdict:
                reports.add_metric([worker, verdict.value], getattr(stats, verdict.value))
            reports.add_metric([worker, "unreported"], stats.unreported)
            clamped.add_metric([worker], stats.clamped)
            capacity.add_metric([worker, "known"], index.ceiling_tokens(worker))
            capacity.add_metric([worker, "learned"], index.capacity_tokens(worker))
        yield from (tokens, reports, clamped, capacity)

    def _units(self) -> Iterator[Metric]:
        """What text keys' characters are worth in tokens, per model (``routing/units.py``)."""
        chars = GaugeMetricFamily(
            "prefix_router_chars_per_token",
            "Characters (UTF-8 bytes) of a text routing key per engine token, learned per model from the "
            "engines' usage.prompt_tokens: kind=learned (the moving average), kind=used (the lower bound "
            "the router predicts with; routing.units)",
            labels=["model", "kind"],
        )
        samples = CounterMetricFamily(
            "prefix_router_units_samples", "Engine reports the token value was learned from", labels=["model"]
        )
        for model, units in self._router.units.summary().items():
            chars.add_metric([model, "learned"], units["chars_per_token"])
            chars.add_metric([model, "used"], units["chars_per_token_used"])
            samples.add_metric([model], units["samples"])
        yield from (chars, samples)

    def _pool_gauges(self, peers: list[dict[str, Any]]) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily("prefix_router_in_flight", "Requests in flight", labels=["worker"])
        healthy = GaugeMetricFamily("prefix_router_worker_healthy", "1 when healthy", labels=["worker"])
        draining = GaugeMetricFamily("prefix_router_worker_draining", "1 when draining", labels=["worker"])
        for w in self._pool:
            others = sum(_count(_part(p, "in_flight", w.name, int)) for p in peers)
            in_flight.add_metric([w.name], self._pool.in_flight(w.name) + others)
            healthy.add_metric([w.name], 1.0 if w.health.healthy else 0.0)
            draining.add_metric([w.name], 1.0 if w.draining else 0.0)
        yield from (in_flight, healthy, draining)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _with_peers(stats: FeedbackStats, worker: str, peers: list[dict[str, Any]]) -> FeedbackStats:
    """``stats`` plus the other processes' tallies for ``worker`` (a bad snapshot adds nothing)."""
    if not peers:
        return stats
    total = dataclasses.replace(stats)
    for peer in peers:
        theirs = _part(peer, "feedback", worker, dict)
        for field in dataclasses.fields(FeedbackStats):
            setattr(total, field.name, getattr(total, field.name) + _count(theirs.get(field.name)))
    return total
