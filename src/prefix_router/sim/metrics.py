"""Prometheus metrics of the simulated engine under vLLM's names, so routers treat it like vLLM.

A collector reads the engine's state at scrape time; each server has its own registry (no globals).
Older vLLM names (``vllm:gpu_cache_usage_perc``, ``vllm:gpu_prefix_cache_*``) are exported as well.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefix_router.sim.engine import EngineModel

LABELS = ("model_name", "engine")


class EngineCollector(Collector):
    def __init__(self, engine: EngineModel, model: str) -> None:
        self.engine = engine
        self.values = [model, "0"]

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
        yield self._cache_config()

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self.values, value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self.values, value)
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


def metrics_registry(engine: EngineModel, model: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
