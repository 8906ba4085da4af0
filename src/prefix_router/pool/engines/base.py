"""The engine-adapter contract: what the pool needs to know about one kind of engine.

One module per engine (``vllm``, ``sglang``, ``llama_cpp``, ``tgi``) implements ``EngineAdapter``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """Load and cache facts scraped from an engine's metrics; None where the engine does not say."""

    queue_depth: int | None = None
    running: int | None = None
    kv_usage: float | None = None
    capacity_tokens: int | None = None
    block_size: int | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None


@dataclass(frozen=True, slots=True)
class FlushRequest:
    """How to empty an engine's prefix cache for a fair benchmark: an HTTP call relative to its base URL."""

    method: str
    path: str


class EngineAdapter(Protocol):
    name: str
    health_path: str
    metrics_path: str | None

    def parse_metrics(self, text: str) -> EngineLoad: ...

    def cached_tokens(self, response: Mapping[str, Any]) -> int | None:
        """Prompt tokens served from cache, from a response body or a final stream chunk."""
        ...

    def flush_request(self) -> FlushRequest | None: ...
