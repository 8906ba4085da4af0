"""SGLang (``python -m sglang.launch_server``): metrics on ``/metrics`` with ``--enable-metrics``.

Metric names from ``python/sglang/srt/metrics/collector.py`` (v0.4 to v0.5): ``sglang:num_queue_reqs``,
``sglang:num_running_reqs`` (gauges), ``sglang:token_usage`` (0..1 share of the KV pool in use),
``sglang:max_total_num_tokens`` (the KV pool size in tokens, v0.4.4+; older releases expose
``sglang:num_used_tokens``, from which the size follows as used / usage), ``sglang:prompt_tokens_total``
and ``sglang:cached_tokens_total`` (token counters; the second is split by ``cache_source`` in v0.5).
The radix cache has page size 1 by default, so no block size is reported.

Cached prompt tokens come back as ``usage.prompt_tokens_details.cached_tokens`` on the OpenAI routes
when the server runs with ``--enable-cache-report``, and as ``meta_info.cached_tokens`` on the native
``/generate`` route. Scheduler gauges are repeated by every tensor-parallel rank (``tp_rank`` label)
and split by data-parallel rank (``dp_rank``): they are maxed within a DP rank and summed across ranks.
``POST /flush_cache`` empties the radix cache (refused while requests run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import prefix_router.pool.engines.promtext as promtext
from prefix_router.pool.engines.base import EngineLoad, FlushRequest
from prefix_router.pool.engines.usage import first_count

QUEUE = "sglang:num_queue_reqs"
RUNNING = "sglang:num_running_reqs"
TOKEN_USAGE = "sglang:token_usage"
MAX_TOKENS = "sglang:max_total_num_tokens"
USED_TOKENS = "sglang:num_used_tokens"
PROMPT = promtext.counter_names("sglang:prompt_tokens")
CACHED = promtext.counter_names("sglang:cached_tokens")
RANK = "dp_rank"  # scheduler gauges repeat per tp_rank; data-parallel ranks hold separate pools
NAMES = frozenset((QUEUE, RUNNING, TOKEN_USAGE, MAX_TOKENS, USED_TOKENS, *PROMPT, *CACHED))


class SglangAdapter:
    """What the pool needs to know about an SGLang server."""

    name: str = "sglang"
    health_path: str = "/health"
    metrics_path: str | None = "/metrics"

    def parse_metrics(self, text: str) -> EngineLoad:
        samples = promtext.parse(text, NAMES)
        hits = promtext.total(samples, *CACHED)
        return EngineLoad(
            queue_depth=promtext.as_int(promtext.grouped_total(samples, RANK, QUEUE)),
            running=promtext.as_int(promtext.grouped_total(samples, RANK, RUNNING)),
            kv_usage=promtext.peak(samples, TOKEN_USAGE),
            capacity_tokens=capacity_tokens(samples),
            prefix_cache_queries=promtext.total(samples, *PROMPT) if hits is not None else None,
            prefix_cache_hits=hits,
        )

    def cached_tokens(self, response: Mapping[str, Any]) -> int | None:
        return first_count(
            response,
            ("usage", "prompt_tokens_details", "cached_tokens"),
            ("meta_info", "cached_tokens"),
        )

    def flush_request(self) -> FlushRequest | None:
        return FlushRequest("POST", "/flush_cache")


def capacity_tokens(samples: Sequence[promtext.Sample]) -> int | None:
    """The KV pool size: stated by new releases, otherwise used tokens over the used share."""
    stated = promtext.as_int(promtext.grouped_total(samples, RANK, MAX_TOKENS))
    if stated:
        return stated
    used = promtext.grouped_total(samples, RANK, USED_TOKENS)
    share = promtext.peak(samples, TOKEN_USAGE)
    if used is None or not share or share <= 0.0:
        return None
    return promtext.as_int(used / share)
