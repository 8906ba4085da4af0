"""Engine adapters: what the pool needs to know about each kind of engine (vLLM, SGLang, llama.cpp, TGI).

One ``EngineSpec`` row per engine (``registry.ENGINES``); ``get_adapter(name)`` returns the adapter for a
configured engine type; ``detect(metrics_text, models_body)`` names the engine behind a server from its
``/metrics`` page or ``/v1/models`` body.
"""

from __future__ import annotations

from prefix_router.pool.engines.base import EngineAdapter, EngineLoad, FlushRequest
from prefix_router.pool.engines.registry import (
    ENGINE_NAMES,
    ENGINES,
    EngineSpec,
    detect,
    engine_spec,
    get_adapter,
    normalize,
)

__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "EngineAdapter",
    "EngineLoad",
    "EngineSpec",
    "FlushRequest",
    "detect",
    "engine_spec",
    "get_adapter",
    "normalize",
]
