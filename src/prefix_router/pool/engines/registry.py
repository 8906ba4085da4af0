"""Adapter lookup by engine name, and engine detection from what a server answers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prefix_router.pool.engines.base import EngineAdapter
from prefix_router.pool.engines.generic import GenericAdapter
from prefix_router.pool.engines.llama_cpp import SHIM_MARKER, LlamaCppAdapter, LlamaCppPythonAdapter
from prefix_router.pool.engines.sglang import SglangAdapter
from prefix_router.pool.engines.tgi import TgiAdapter
from prefix_router.pool.engines.vllm import VllmAdapter

_FACTORIES: Mapping[str, Callable[[], EngineAdapter]] = {
    "vllm": VllmAdapter,
    "sglang": SglangAdapter,
    "llama_cpp": LlamaCppAdapter,
    "llama_cpp_python": LlamaCppPythonAdapter,
    "tgi": TgiAdapter,
    "generic": GenericAdapter,
}
_ALIASES: Mapping[str, str] = {
    "llamacpp": "llama_cpp",
    "llama_server": "llama_cpp",
    "llamacpp_python": "llama_cpp_python",
    "text_generation_inference": "tgi",
    "openai": "generic",
}
ENGINE_NAMES: tuple[str, ...] = tuple(_FACTORIES)

# metric-name prefix -> engine, checked on each series line of a /metrics page
_METRIC_PREFIXES: tuple[tuple[str, str], ...] = (
    ("vllm:", "vllm"),
    ("sglang:", "sglang"),
    ("llamacpp:", "llama_cpp"),
    ("tgi_", "tgi"),
)
# /v1/models ``owned_by`` -> engine
_OWNERS: Mapping[str, str] = {
    "vllm": "vllm",
    "sglang": "sglang",
    "llamacpp": "llama_cpp",
    "me": "llama_cpp_python",
}


def normalize(name: str) -> str:
    """Canonical engine name: case-insensitive, ``-``, ``.`` and spaces read as ``_``; aliases resolved."""
    key = name.strip().lower().replace("-", "_").replace(".", "_").replace(" ", "_")
    return _ALIASES.get(key, key)


def get_adapter(name: str) -> EngineAdapter:
    """A fresh adapter for the named engine; raises KeyError naming the known engines."""
    key = normalize(name)
    if key not in _FACTORIES:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(ENGINE_NAMES)}")
    return _FACTORIES[key]()


def detect(metrics_text: str | None, models_body: Mapping[str, Any] | None) -> str:
    """The engine behind a server, from its ``/metrics`` page and/or ``/v1/models`` body; else ``generic``."""
    by_models = engine_from_models(models_body) if models_body is not None else None
    by_metrics = engine_from_metrics(metrics_text) if metrics_text else None
    if by_metrics == "llama_cpp" and (by_models == "llama_cpp_python" or SHIM_MARKER in (metrics_text or "")):
        return "llama_cpp_python"
    return by_metrics or by_models or "generic"


def engine_from_metrics(text: str) -> str | None:
    """The engine whose metric names appear first among the series of a Prometheus page."""
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        for prefix, engine in _METRIC_PREFIXES:
            if line.startswith(prefix):
                return engine
    return None


def engine_from_models(body: Mapping[str, Any]) -> str | None:
    """The engine from the first ``/v1/models`` entry: its ``owned_by``, or TGI's id-as-owner shape."""
    data = body.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], Mapping):
        return None
    entry: Mapping[str, Any] = data[0]
    owner = entry.get("owned_by")
    if isinstance(owner, str) and owner in _OWNERS:
        return _OWNERS[owner]
    if owner is not None and owner == entry.get("id") and entry.get("created") == 0:
        return "tgi"
    return None
