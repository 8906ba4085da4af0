"""Engine adapters: what the pool needs to know about each kind of engine (vLLM, SGLang, llama.cpp, TGI).

``get_adapter(name)`` returns the adapter for a configured engine type; ``detect(metrics_text,
models_body)`` names the engine behind a server from its ``/metrics`` page or ``/v1/models`` body.
"""

from __future__ import annotations

from prefix_router.pool.engines.base import EngineAdapter, EngineLoad, FlushRequest
from prefix_router.pool.engines.registry import ENGINE_NAMES, detect, get_adapter, normalize

__all__ = [
    "ENGINE_NAMES",
    "EngineAdapter",
    "EngineLoad",
    "FlushRequest",
    "detect",
    "get_adapter",
    "normalize",
]
