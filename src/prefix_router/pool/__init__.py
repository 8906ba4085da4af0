"""The worker pool: configured and discovered workers, their health, the engines' own load and cache
reports (one adapter per engine kind), and the HTTP fetcher they are read through. Other packages import
only the names below.
"""

from __future__ import annotations

from prefix_router.pool.engines import promtext
from prefix_router.pool.engines.base import EngineAdapter, EngineLoad
from prefix_router.pool.engines.registry import detect, get_adapter
from prefix_router.pool.engines.usage import count, dig, openai_cached_tokens
from prefix_router.pool.http import AiohttpFetcher, Fetcher, client_session
from prefix_router.pool.kv_events import EventSubscriber, EventSubscriptions, KvEventsCollector
from prefix_router.pool.monitor import PoolMonitor
from prefix_router.pool.pool import PoolError, WorkerPool
from prefix_router.pool.settings import (
    DiscoverySettings,
    HealthSettings,
    KvEventsSettings,
    ScrapeSettings,
    WorkerSettings,
    unique_worker_names,
    workers_from_urls,
)
from prefix_router.pool.worker import Worker
from prefix_router.pool.worker_discovery.wiring import DiscoveryCollector, WorkerDiscovery

__all__ = [
    "AiohttpFetcher",
    "DiscoveryCollector",
    "DiscoverySettings",
    "EngineAdapter",
    "EngineLoad",
    "EventSubscriber",
    "EventSubscriptions",
    "Fetcher",
    "HealthSettings",
    "KvEventsCollector",
    "KvEventsSettings",
    "PoolError",
    "PoolMonitor",
    "ScrapeSettings",
    "Worker",
    "WorkerDiscovery",
    "WorkerPool",
    "WorkerSettings",
    "client_session",
    "count",
    "detect",
    "dig",
    "get_adapter",
    "openai_cached_tokens",
    "promtext",
    "unique_worker_names",
    "workers_from_urls",
]
