"""Identifying each worker: the models it lists (``GET /v1/models``) and the engine it runs."""

from __future__ import annotations

from typing import Any

import orjson

from prefix_router.pool.engines import detect, get_adapter
from prefix_router.pool.engines.base import EngineAdapter
from prefix_router.pool.health import auth_headers
from prefix_router.pool.http import Fetcher, FetchError
from prefix_router.pool.worker import Worker

MODELS_MAX_BYTES = 4 * 1024 * 1024
METRICS_PATH = "/metrics"


class Identifier:
    """Learns each worker's listed models (bounded) and which engine it runs."""

    def __init__(self, fetcher: Fetcher, timeout_s: float, max_models: int, metrics_max_bytes: int) -> None:
        self._fetcher = fetcher
        self._timeout_s = timeout_s
        self._max_models = max_models
        self._metrics_max_bytes = metrics_max_bytes

    async def identify(self, worker: Worker) -> None:
        body = await self._get_json(worker, "/v1/models", MODELS_MAX_BYTES)
        if body is not None:
            models = parse_models(body, self._max_models)
            if models is not None:
                worker.listed_models = models
                worker.identity_stale = False
        if worker.adapter is None:
            worker.adapter = await self._adapter(worker, body)

    async def _adapter(self, worker: Worker, models_body: dict[str, Any] | None) -> EngineAdapter:
        if worker.engine != "auto":
            return get_adapter(worker.engine)
        text = await self._get_text(worker, METRICS_PATH, self._metrics_max_bytes)
        return get_adapter(detect(text, models_body))

    async def _get_json(self, worker: Worker, path: str, max_bytes: int) -> dict[str, Any] | None:
        text = await self._get_text(worker, path, max_bytes)
        try:
            body = orjson.loads(text) if text is not None else None
        except orjson.JSONDecodeError:
            return None
        return body if isinstance(body, dict) else None

    async def _get_text(self, worker: Worker, path: str, max_bytes: int) -> str | None:
        try:
            got = await self._fetcher.get(worker.url + path, auth_headers(worker), self._timeout_s, max_bytes)
        except FetchError:
            return None
        return got.body.decode("utf-8", "replace") if got.status == 200 else None


def parse_models(body: dict[str, Any], limit: int) -> dict[str, dict[str, Any]] | None:
    """``{"data": [{"id": ...}, ...]}`` -> ``{id: entry}`` (at most ``limit``); None if not that shape."""
    data = body.get("data")
    if not isinstance(data, list):
        return None
    models: dict[str, dict[str, Any]] = {}
    for entry in data:
        if len(models) >= limit:
            break
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            models[entry["id"]] = entry
    return models
