"""llama.cpp: the C++ ``llama-server``, and ``llama-cpp-python``'s server run through prefix-router's shim.

``llama-server`` (``tools/server``, builds b5000 to b7000+) with ``--metrics`` serves on ``/metrics``:
``llamacpp:requests_processing`` and ``llamacpp:requests_deferred`` (gauges: running and queued),
``llamacpp:prompt_tokens_total`` (prompt tokens evaluated, *excluding* cached ones) and
``llamacpp:prompt_tokens_cached_total`` (prompt tokens reused from the cache, recent builds), and, in
builds before the unified KV cache (mid 2025), ``llamacpp:kv_cache_usage_ratio`` and
``llamacpp:kv_cache_tokens``. So the prefix-cache queries are evaluated + cached tokens. Responses carry
``timings.cache_n`` (tokens reused) and, in recent builds, ``usage.prompt_tokens_details.cached_tokens``.
The cache is per slot; there is no global flush (``POST /slots/{id}?action=erase`` empties one slot).

``llama-cpp-python`` (``python -m llama_cpp.server``, 0.3.x) has no ``/health``, no ``/metrics`` and
reports no cached tokens; its ``/v1/models`` answers ``owned_by: "me"`` and waits for the model lock.
prefix-router's shim (``llama_cpp_server.py``) adds ``/health``, ``/metrics`` under the llama-server names
above (plus ``llamacpp:prompt_cache_entries`` / ``llamacpp:prompt_cache_bytes`` for its RAM prompt cache)
and ``POST /reset_prefix_cache``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import prefix_router.pool.engines.promtext as promtext
from prefix_router.pool.engines.base import EngineLoad, FlushRequest
from prefix_router.pool.engines.usage import first_count

DEFERRED = "llamacpp:requests_deferred"
PROCESSING = "llamacpp:requests_processing"
KV_RATIO = "llamacpp:kv_cache_usage_ratio"
EVALUATED = promtext.counter_names("llamacpp:prompt_tokens")
CACHED = promtext.counter_names("llamacpp:prompt_tokens_cached")
SHIM_MARKER = "llamacpp:prompt_cache_entries"
NAMES = frozenset((DEFERRED, PROCESSING, KV_RATIO, *EVALUATED, *CACHED))


def parse_llamacpp_metrics(text: str) -> EngineLoad:
    """Load and cache counters from a ``llamacpp:`` metrics page (llama-server or the shim)."""
    samples = promtext.parse(text, NAMES)
    hits = promtext.total(samples, *CACHED)
    evaluated = promtext.total(samples, *EVALUATED)
    return EngineLoad(
        queue_depth=promtext.as_int(promtext.total(samples, DEFERRED)),
        running=promtext.as_int(promtext.total(samples, PROCESSING)),
        kv_usage=promtext.peak(samples, KV_RATIO),
        prefix_cache_queries=None if hits is None or evaluated is None else hits + evaluated,
        prefix_cache_hits=hits,
    )


def llamacpp_cached_tokens(response: Mapping[str, Any]) -> int | None:
    """``timings.cache_n`` (native and OpenAI routes), else the OpenAI usage field."""
    return first_count(response, ("timings", "cache_n"), ("usage", "prompt_tokens_details", "cached_tokens"))


class LlamaCppAdapter:
    """The C++ ``llama-server``."""

    name: str = "llama_cpp"
    health_path: str = "/health"
    metrics_path: str | None = "/metrics"

    def parse_metrics(self, text: str) -> EngineLoad:
        return parse_llamacpp_metrics(text)

    def cached_tokens(self, response: Mapping[str, Any]) -> int | None:
        return llamacpp_cached_tokens(response)

    def flush_request(self) -> FlushRequest | None:
        return None


class LlamaCppPythonAdapter(LlamaCppAdapter):
    """``llama-cpp-python``'s server behind prefix-router's shim (``prefix-router engines llama-cpp``): the
    llama-server routes and metrics, plus a prefix-cache flush."""

    name: str = "llama_cpp_python"

    def flush_request(self) -> FlushRequest | None:
        return FlushRequest("POST", "/reset_prefix_cache")
