"""llama-cpp-python's OpenAI server, with what a router in front of it needs. Runs in the llama venv.

Started by the launcher as ``LLAMA_VENV/bin/python -I llama_cpp_server.py --settings JSON`` (a file path,
not ``-m``: prefix-router is not installed in that venv), so only the standard library is imported at module
level; ``llama_cpp``, ``fastapi`` and ``uvicorn`` come from the llama venv inside ``main``.

Added to the stock server (``llama_cpp.server.app.create_app``):
- ``GET /health``: 200 at once (the stock ``/v1/models`` waits for the model lock during a generation);
- ``GET /metrics``: the C++ llama-server's names, ``llamacpp:prompt_tokens_total`` (prompt tokens
  evaluated, excluding reused ones), ``llamacpp:prompt_tokens_cached_total`` (prompt tokens whose KV state
  was reused), ``llamacpp:requests_processing`` / ``llamacpp:requests_deferred``, plus
  ``llamacpp:prompt_cache_entries`` / ``llamacpp:prompt_cache_bytes`` for the RAM prompt cache;
- ``POST /reset_prefix_cache``: empties the RAM prompt cache and the live context, for fair benchmarks.

Replies are unchanged: llama-cpp-python reports no cached-token count (its response models drop extra
``usage`` keys, and streams carry no usage), so the router learns reuse from ``/metrics`` only.

Reuse is measured inside the engine: at the first ``Llama.eval`` of a ``Llama.generate`` call, ``n_tokens``
is the length of the prefix whose KV state was kept (live context or restored from the RAM cache).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


class PromptStats:
    """Counters shared by the generation thread and the event loop (guarded by one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.evaluated = 0
        self.cached = 0
        self.in_flight = 0
        self.cache: Any = None

    def record(self, cached: int, evaluated: int) -> None:
        with self._lock:
            self.cached += cached
            self.evaluated += evaluated

    def add_in_flight(self, delta: int) -> None:
        with self._lock:
            self.in_flight += delta

    def snapshot(self) -> tuple[int, int, int]:
        with self._lock:
            return self.evaluated, self.cached, self.in_flight


def patch_llama(llama_cls: Any, stats: PromptStats) -> None:
    """Count reused vs evaluated prompt tokens per generation (this process serves one model)."""
    original_generate = llama_cls.generate
    original_eval = llama_cls.eval

    def generate(self: Any, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Iterator[int]:
        self._prefix_router_pending = len(tokens)
        stats.cache = self.cache
        try:
            yield from original_generate(self, tokens, *args, **kwargs)
        finally:
            settle(self, stats, cached_so_far=getattr(self, "_prefix_router_pending", 0))

    def eval_tokens(self: Any, tokens: Sequence[int]) -> None:
        pending = getattr(self, "_prefix_router_pending", 0)
        if pending:
            settle(self, stats, cached_so_far=min(int(self.n_tokens), pending))
        original_eval(self, tokens)

    llama_cls.generate = generate
    llama_cls.eval = eval_tokens


def settle(llama: Any, stats: PromptStats, cached_so_far: int) -> None:
    """Book the pending prompt once: ``cached_so_far`` reused, the rest evaluated."""
    pending = getattr(llama, "_prefix_router_pending", 0)
    if pending:
        stats.record(cached=cached_so_far, evaluated=pending - cached_so_far)
        llama._prefix_router_pending = 0


def cache_facts(cache: Any) -> tuple[int, int]:
    """(entries, bytes) of a llama-cpp-python RAM prompt cache; zeros when absent or busy."""
    if cache is None:
        return 0, 0
    try:
        states = list(cache.cache_state.values())
    except (AttributeError, RuntimeError):
        return 0, 0
    return len(states), sum(int(s.llama_state_size) for s in states)


def metrics_text(stats: PromptStats) -> str:
    evaluated, cached, in_flight = stats.snapshot()
    entries, size = cache_facts(stats.cache)
    rows = (
        ("prompt_tokens_total", "counter", "Prompt tokens processed, excluding cached tokens", evaluated),
        ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache", cached),
        ("requests_processing", "gauge", "Number of requests processing", min(in_flight, 1)),
        ("requests_deferred", "gauge", "Number of requests deferred", max(in_flight - 1, 0)),
        ("prompt_cache_entries", "gauge", "Prompt states held in the RAM prompt cache", entries),
        ("prompt_cache_bytes", "gauge", "Bytes held in the RAM prompt cache", size),
    )
    return "".join(_metric(name, kind, text, value) for name, kind, text, value in rows)


def _metric(name: str, kind: str, help_text: str, value: int) -> str:
    full = f"llamacpp:{name}"
    return f"# HELP {full} {help_text}\n# TYPE {full} {kind}\n{full} {value}\n"


def in_flight_middleware(app: ASGIApp, stats: PromptStats) -> ASGIApp:
    """Count generation requests from arrival until their (possibly streamed) response has been sent."""

    async def middleware(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        counted = scope.get("type") == "http" and scope.get("path") in GENERATION_PATHS
        if counted:
            stats.add_in_flight(1)
        try:
            await app(scope, receive, send)
        finally:
            if counted:
                stats.add_in_flight(-1)

    return middleware


def reset_llama(llama: Any) -> None:
    """Forget every cached prompt state and the live context."""
    cache = getattr(llama, "cache", None)
    if cache is not None:
        llama.set_cache(type(cache)(capacity_bytes=cache.capacity_bytes))
    llama.reset()


def add_routes(app: Any, app_module: Any, stats: PromptStats) -> None:
    fastapi = importlib.import_module("fastapi")
    responses = importlib.import_module("fastapi.responses")

    async def health() -> dict[str, str]:
        return {"status": "ok"}

    async def metrics() -> Any:
        return responses.PlainTextResponse(metrics_text(stats), media_type="text/plain; version=0.0.4")

    model_lock = fastapi.Depends(app_module.get_llama_proxy)  # waits for the running generation

    async def reset_prefix_cache(proxy: Any = model_lock) -> dict[str, bool]:
        reset_llama(proxy())
        stats.cache = proxy().cache
        return {"success": True}

    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_api_route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"])


def build_app(settings: dict[str, Any], stats: PromptStats) -> ASGIApp:
    llama_cpp = importlib.import_module("llama_cpp")
    app_module = importlib.import_module("llama_cpp.server.app")
    settings_module = importlib.import_module("llama_cpp.server.settings")
    patch_llama(llama_cpp.Llama, stats)
    app = app_module.create_app(settings=settings_module.Settings(**settings))
    add_routes(app, app_module, stats)
    return in_flight_middleware(app, stats)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--settings", required=True, help="llama_cpp.server Settings as a JSON object")
    return parser.parse_args(argv)


def drop_own_folder_from_path() -> None:
    """This folder holds ``llama_cpp.py`` (the adapter), which would shadow the ``llama_cpp`` package."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]


def main(argv: Sequence[str] | None = None) -> int:
    drop_own_folder_from_path()
    settings: dict[str, Any] = json.loads(parse_args(argv).settings)
    app = build_app(settings, PromptStats())
    uvicorn = importlib.import_module("uvicorn")
    host, port = settings.get("host", "127.0.0.1"), int(settings.get("port", 8000))
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
