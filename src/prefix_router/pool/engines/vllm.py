"""vLLM (``vllm serve``): OpenAI-compatible server with Prometheus metrics on ``/metrics``.

Metric names are those registered in ``vllm/v1/metrics/loggers.py`` (v0.9 to v0.11+):
``vllm:num_requests_waiting`` / ``vllm:num_requests_running`` (gauges), ``vllm:kv_cache_usage_perc``
(0..1; ``vllm:gpu_cache_usage_perc`` before 0.9 and still emitted, deprecated, until 0.10),
``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (token counters, exposed with ``_total``;
``vllm:gpu_prefix_cache_*`` in 0.8), and ``vllm:cache_config_info`` whose labels carry ``block_size``,
``num_gpu_blocks`` and, in recent releases, ``kv_cache_size_tokens``. With data parallelism each engine
core is a series with its own ``engine`` label: counts are summed, usage is the fullest engine's.

Cached prompt tokens come back as ``usage.prompt_tokens_details.cached_tokens`` when the server runs
with ``--enable-prompt-tokens-details``. ``POST /reset_prefix_cache`` empties the prefix cache; recent
releases serve it only with ``VLLM_SERVER_DEV_MODE=1``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import prefix_router.pool.engines.promtext as promtext
from prefix_router.pool.engines.base import EngineLoad, FlushRequest
from prefix_router.pool.engines.usage import openai_cached_tokens

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
QUERIES = (
    *promtext.counter_names("vllm:prefix_cache_queries"),
    *promtext.counter_names("vllm:gpu_prefix_cache_queries"),
)
HITS = (
    *promtext.counter_names("vllm:prefix_cache_hits"),
    *promtext.counter_names("vllm:gpu_prefix_cache_hits"),
)
CACHE_INFO = "vllm:cache_config_info"
ENGINE = "engine"  # one series per engine core (data parallel rank)
NAMES = frozenset((WAITING, RUNNING, *KV_USAGE, *QUERIES, *HITS, CACHE_INFO))


class VllmAdapter:
    """What the pool needs to know about a vLLM server."""

    name: str = "vllm"
    health_path: str = "/health"
    metrics_path: str | None = "/metrics"

    def parse_metrics(self, text: str) -> EngineLoad:
        samples = promtext.parse(text, NAMES)
        info = promtext.label_sets(samples, CACHE_INFO)
        return EngineLoad(
            queue_depth=promtext.as_int(promtext.grouped_total(samples, ENGINE, WAITING)),
            running=promtext.as_int(promtext.grouped_total(samples, ENGINE, RUNNING)),
            kv_usage=promtext.peak(samples, *KV_USAGE),
            capacity_tokens=capacity_tokens(info),
            block_size=block_size(info),
            prefix_cache_queries=promtext.total(samples, *QUERIES),
            prefix_cache_hits=promtext.total(samples, *HITS),
        )

    def cached_tokens(self, response: Mapping[str, Any]) -> int | None:
        return openai_cached_tokens(response)

    def flush_request(self) -> FlushRequest | None:
        return FlushRequest("POST", "/reset_prefix_cache")


def block_size(info: Sequence[Mapping[str, str]]) -> int | None:
    """The KV block size in tokens, from the first ``cache_config_info`` series that states it."""
    sizes = [s for s in (promtext.label_int(labels, "block_size") for labels in info) if s]
    return sizes[0] if sizes else None


def capacity_tokens(info: Sequence[Mapping[str, str]]) -> int | None:
    """KV-cache size in tokens summed over engine cores (data parallel ranks hold separate caches)."""
    per_engine = {labels.get(ENGINE, ""): _engine_capacity(labels) for labels in info}
    known = [c for c in per_engine.values() if c]
    return sum(known) if known else None


def _engine_capacity(labels: Mapping[str, str]) -> int | None:
    stated = promtext.label_int(labels, "kv_cache_size_tokens")
    if stated:
        return stated
    size = promtext.label_int(labels, "block_size")
    blocks = promtext.label_int(labels, "num_gpu_blocks")
    return size * blocks if size and blocks else None
