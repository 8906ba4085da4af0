"""Prometheus metrics of the simulated engine under vLLM's names, so routers treat it like vLLM.

A collector reads the engine's state at scrape time; each server has its own registry (no globals).
Older vLLM names (``vllm:gpu_cache_usage_perc``, ``vllm:gpu_prefix_cache_*``) are exported as well, and
two of its own: ``prefix_router_sim:busy_seconds_total`` (engine time spent running steps, model seconds)
and ``prefix_router_sim:time_scale`` (wall seconds per model second), so a benchmark can state how busy
the fleet was: busy fraction = busy seconds x time scale / wall seconds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefix_router.lab.sim.engine import EngineModel

LABELS = ("model_name", "engine")


class EngineCollector(Collector):
    def __init__(
        self,
        engine: EngineModel,
        model: str,
        time_scale: float = 1.0,
        finished: Mapping[str, int] | None = None,
    ) -> None:
        self.engine = engine
        self.values = [model, "0"]
        self.time_scale = time_scale
        self.finished = finished

    def collect(self) -> Iterator[Metric]:
        e, stats = self.engine, self.engine.stats
        yield self._gauge("vllm:num_requests_running", "Requests in the running batch.", e.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", e.num_waiting)
        for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            yield self._gauge(name, "KV-cache usage. 1 means 100 percent usage.", e.kv_usage)
        for prefix in ("vllm:prefix_cache", "vllm:gpu_prefix_cache"):
            yield self._counter(f"{prefix}_queries", "Prefix cache queries, in tokens.", stats.prefix_queries)
            yield self._counter(f"{prefix}_hits", "Prefix cache hits, in tokens.", stats.prefix_hits)
        yield self._counter("vllm:prompt_tokens", "Prefill tokens processed.", stats.prompt_tokens)
        yield self._counter("vllm:generation_tokens", "Generation tokens processed.", stats.generation_tokens)
        yield self._counter("vllm:num_preemptions", "Cumulative preemptions.", 0)
        if self.finished is not None:
            yield self._finished(self.finished)
        busy_doc = "Simulated engine time spent running steps, in model seconds (simulated)."
        yield self._counter("prefix_router_sim:busy_seconds", busy_doc, stats.busy_s)
        scale_doc = "Wall seconds per model second of this simulated engine (--time-scale)."
        yield self._gauge("prefix_router_sim:time_scale", scale_doc, self.time_scale)
        yield self._cache_config()

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self.values, value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self.values, value)
        return family

    def _finished(self, finished: Mapping[str, int]) -> CounterMetricFamily:
        doc = "Count of successfully processed requests."
        family = CounterMetricFamily("vllm:request_success", doc, labels=(*LABELS, "finished_reason"))
        for reason in sorted(finished):
            family.add_metric([*self.values, reason], finished[reason])
        return family

    def _cache_config(self) -> GaugeMetricFamily:
        e = self.engine
        labels = {
            "block_size": str(e.block_tokens),
            "num_gpu_blocks": str(e.cache.capacity_blocks),
            "enable_prefix_caching": "True",
            "cache_dtype": "auto",
        }
        doc = "Information of the cache config."
        family = GaugeMetricFamily("vllm:cache_config_info", doc, labels=list(labels))
        family.add_metric(list(labels.values()), 1.0)
        return family


def metrics_registry(
    engine: EngineModel, model: str, time_scale: float = 1.0, finished: Mapping[str, int] | None = None
) -> CollectorRegistry:
    """The engine's metrics; ``finished`` (requests by finished_reason, kept by the HTTP server) is
    exported as ``vllm:request_success_total``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model, time_scale, finished))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
