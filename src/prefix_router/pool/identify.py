"""Identifying each worker: the models it lists (``GET /v1/models``), the engine it runs, and, for an
SGLang worker without ``kv_events``, where it publishes its KV cache events (``kv_discovery``: its
``/server_info``; read again at every identification, so a restarted engine's new advert replaces it)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from prefix_router.pool.engines import detect, get_adapter
from prefix_router.pool.engines.base import EngineAdapter
from prefix_router.pool.health import auth_headers
from prefix_router.pool.http import Fetcher, FetchError
from prefix_router.pool.kv_discovery import SERVER_INFO_PATHS, advertised
from prefix_router.pool.worker import Worker

log = logging.getLogger(__name__)

MODELS_MAX_BYTES = 4 * 1024 * 1024
SERVER_INFO_MAX_BYTES = 4 * 1024 * 1024
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
        if worker.adapter.name == "sglang" and (worker.kv_events is None or worker.kv_events_advertised):
            await self._discover_events(worker)

    async def _discover_events(self, worker: Worker) -> None:
        """``worker.kv_events`` from its server info (unchanged when none answers)."""
        for path in SERVER_INFO_PATHS:
            info = await self._get_json(worker, path, SERVER_INFO_MAX_BYTES)
            if info is not None:
                break
        else:
            return
        advert = advertised(info, worker.url)
        if advert.settings != worker.kv_events:
            log.info("kv events of %s: %s", worker.name, advert.reason)
            worker.kv_events, worker.kv_events_advertised = advert.settings, advert.settings is not None

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
