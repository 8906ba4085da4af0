"""The engines, one ``EngineSpec`` row each: adapter lookup by name, and engine detection from what a
server answers (its ``/metrics`` page, its ``/v1/models`` body).

Adding an engine: write its adapter module (``EngineAdapter``: health path, metrics parsing, cached
tokens, cache flush) and add its row to ``ENGINES``. ``ENGINE_NAMES``, the accepted ``engine:`` values
and their aliases, and detection all follow from the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prefix_router.pool.engines.base import EngineAdapter
from prefix_router.pool.engines.generic import GenericAdapter
from prefix_router.pool.engines.llama_cpp import SHIM_MARKER, LlamaCppAdapter, LlamaCppPythonAdapter
from prefix_router.pool.engines.sglang import SglangAdapter
from prefix_router.pool.engines.tgi import TgiAdapter, is_tgi_models_entry
from prefix_router.pool.engines.vllm import VllmAdapter

ModelsRule = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One kind of engine.

    ``aliases``: other spellings accepted for ``engine:`` (after ``normalize``). Detection:
    ``metric_prefixes``, series-name prefixes of its ``/metrics`` page; ``owners``, ``owned_by`` values of
    its ``/v1/models`` entries; ``models_rule``, a test of its first ``/v1/models`` entry for engines
    without an owner of their own; ``refines`` + ``metric_markers``, for an engine that serves another's
    metric names (a shim): detected as this one when the other is detected and its models say so or one
    of the markers appears on the page.
    """

    name: str
    factory: Callable[[], EngineAdapter]
    summary: str
    aliases: tuple[str, ...] = ()
    metric_prefixes: tuple[str, ...] = ()
    owners: tuple[str, ...] = ()
    models_rule: ModelsRule | None = None
    refines: str | None = None
    metric_markers: tuple[str, ...] = ()


ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec("vllm", VllmAdapter, "vLLM", metric_prefixes=("vllm:",), owners=("vllm",)),
    EngineSpec("sglang", SglangAdapter, "SGLang", metric_prefixes=("sglang:",), owners=("sglang",)),
    EngineSpec("llama_cpp", LlamaCppAdapter, "llama.cpp llama-server", aliases=("llamacpp", "llama_server"),
               metric_prefixes=("llamacpp:",), owners=("llamacpp",)),
    EngineSpec("llama_cpp_python", LlamaCppPythonAdapter, "llama-cpp-python behind prefix-router's shim",
               aliases=("llamacpp_python",), owners=("me",),
               refines="llama_cpp", metric_markers=(SHIM_MARKER,)),
    EngineSpec("tgi", TgiAdapter, "Hugging Face Text Generation Inference",
               aliases=("text_generation_inference",), metric_prefixes=("tgi_",),
               models_rule=is_tgi_models_entry),
    EngineSpec("generic", GenericAdapter, "any other OpenAI-compatible server", aliases=("openai",)),
)  # fmt: skip
ENGINE_NAMES: tuple[str, ...] = tuple(spec.name for spec in ENGINES)
_BY_NAME: Mapping[str, EngineSpec] = {spec.name: spec for spec in ENGINES}
_ALIASES: Mapping[str, str] = {alias: spec.name for spec in ENGINES for alias in spec.aliases}
_METRIC_PREFIXES: tuple[tuple[str, str], ...] = tuple(
    (prefix, spec.name) for spec in ENGINES for prefix in spec.metric_prefixes
)
_OWNERS: Mapping[str, str] = {owner: spec.name for spec in ENGINES for owner in spec.owners}


def normalize(name: str) -> str:
    """Canonical engine name: case-insensitive, ``-``, ``.`` and spaces read as ``_``; aliases resolved."""
    key = name.strip().lower().replace("-", "_").replace(".", "_").replace(" ", "_")
    return _ALIASES.get(key, key)


def engine_spec(name: str) -> EngineSpec:
    """The row of the named engine (aliases accepted); raises KeyError naming the known engines."""
    spec = _BY_NAME.get(normalize(name))
    if spec is None:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(ENGINE_NAMES)}")
    return spec


def get_adapter(name: str) -> EngineAdapter:
    """A fresh adapter for the named engine; raises KeyError naming the known engines."""
    return engine_spec(name).factory()


def detect(metrics_text: str | None, models_body: Mapping[str, Any] | None) -> str:
    """The engine behind a server, from its ``/metrics`` page and/or ``/v1/models`` body; else ``generic``."""
    by_models = engine_from_models(models_body) if models_body is not None else None
    by_metrics = engine_from_metrics(metrics_text) if metrics_text else None
    for spec in ENGINES:
        if (
            by_metrics is not None
            and spec.refines == by_metrics
            and _named(spec, by_models, metrics_text or "")
        ):
            return spec.name
    return by_metrics or by_models or "generic"


def _named(shim: EngineSpec, by_models: str | None, metrics_text: str) -> bool:
    return by_models == shim.name or any(marker in metrics_text for marker in shim.metric_markers)


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
    """The engine from the first ``/v1/models`` entry: its ``owned_by``, else a row's ``models_rule``."""
    data = body.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], Mapping):
        return None
    entry: Mapping[str, Any] = data[0]
    owner = entry.get("owned_by")
    if isinstance(owner, str) and owner in _OWNERS:
        return _OWNERS[owner]
    return next(
        (spec.name for spec in ENGINES if spec.models_rule is not None and spec.models_rule(entry)), None
    )
