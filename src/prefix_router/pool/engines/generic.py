"""Any other OpenAI-compatible server: health only, and the standard cached-token field if it is there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefix_router.pool.engines.base import EngineLoad, FlushRequest
from prefix_router.pool.engines.usage import openai_cached_tokens


class GenericAdapter:
    """The fallback: no metrics, no flush; ``/health`` (the pool falls back to ``/v1/models``)."""

    name: str = "generic"
    health_path: str = "/health"
    metrics_path: str | None = None

    def parse_metrics(self, text: str) -> EngineLoad:
        return EngineLoad()

    def cached_tokens(self, response: Mapping[str, Any]) -> int | None:
        return openai_cached_tokens(response)

    def flush_request(self) -> FlushRequest | None:
        return None
