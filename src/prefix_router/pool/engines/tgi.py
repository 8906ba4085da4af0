"""Hugging Face Text Generation Inference (``text-generation-launcher``), v2 and v3.

Metric names from ``docs/source/reference/metrics.md`` (v3.x): ``tgi_queue_size`` (waiting requests),
``tgi_batch_current_size`` (requests in the running batch). TGI publishes neither a KV-usage gauge nor
prefix-cache counters, and its OpenAI routes report no cached tokens; v3 caches prefixes itself
(``PREFIX_CACHING``, on by default with the flashinfer backend). The KV budget is
``max_batch_total_tokens`` in ``GET /info``, not in metrics. There is no cache flush endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import prefix_router.pool.engines.promtext as promtext
from prefix_router.pool.engines.base import EngineLoad, FlushRequest
from prefix_router.pool.engines.usage import openai_cached_tokens

QUEUE = "tgi_queue_size"
RUNNING = "tgi_batch_current_size"
NAMES = frozenset((QUEUE, RUNNING))


def is_tgi_models_entry(entry: Mapping[str, Any]) -> bool:
    """TGI's ``/v1/models`` entry: ``owned_by`` repeats the ``id``, with ``created: 0``."""
    owner = entry.get("owned_by")
    return owner is not None and owner == entry.get("id") and entry.get("created") == 0


class TgiAdapter:
    """What the pool needs to know about a TGI server."""

    name: str = "tgi"
    health_path: str = "/health"
    metrics_path: str | None = "/metrics"

    def parse_metrics(self, text: str) -> EngineLoad:
        samples = promtext.parse(text, NAMES)
        return EngineLoad(
            queue_depth=promtext.as_int(promtext.total(samples, QUEUE)),
            running=promtext.as_int(promtext.total(samples, RUNNING)),
        )

    def cached_tokens(self, response: Mapping[str, Any]) -> int | None:
        return openai_cached_tokens(response)

    def flush_request(self) -> FlushRequest | None:
        return None
