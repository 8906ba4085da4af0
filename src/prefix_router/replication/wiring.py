"""Plugging the replication into an aiohttp router app: ``install(app, router, settings)`` adds start-up
and clean-up hooks and returns a slot holding the replication once started; ``ReplicationCollector`` maps
its counters to Prometheus metrics.

aiohttp runs ``on_startup`` hooks before it accepts connections, so the warm-up from the stream backlog is
over before a probe can reach ``/ready``: ``/ready`` has nothing to wait for here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Protocol

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefix_router.replication.connect import attach
from prefix_router.replication.settings import ReplicationSettings
from prefix_router.replication.sync import Clock, RedisReplication
from prefix_router.routing import Router

GAUGES = frozenset({"outbox_size", "connected", "warmed", "ready", "remote_replicas", "warmup_seconds"})
PREFIX = "prefix_router_replication_"


class ReplicationSlot:
    """Holds the app's :class:`RedisReplication` once started (filled by the start-up hook)."""

    def __init__(self) -> None:
        self.replication: RedisReplication | None = None

    def stats(self) -> dict[str, float]:
        return self.replication.stats() if self.replication is not None else {}


def install(
    app: web.Application,
    router: Router,
    settings: ReplicationSettings,
    *,
    clock: Clock = time.monotonic,
) -> ReplicationSlot:
    """Share ``router``'s prefix view through the Redis at ``settings.url`` for the app's lifetime."""
    if settings.url is None:
        raise ValueError("replication.url: required to replicate")
    url, slot = settings.url, ReplicationSlot()

    async def start(_: web.Application) -> None:
        slot.replication = await attach(router, url, settings.replica_id, settings, clock=clock)

    async def stop(_: web.Application) -> None:
        if slot.replication is not None:
            await slot.replication.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return slot


class HasStats(Protocol):
    def stats(self) -> dict[str, float]: ...


class ReplicationCollector(Collector):
    """``prefix_router_replication_<counter>_total`` counters, ``prefix_router_replication_<gauge>``
    gauges, from a ``ReplicationSlot`` (Redis) or a ``LocalReplication`` (``serve --processes``)."""

    def __init__(self, slot: HasStats) -> None:
        self.slot = slot

    def collect(self) -> Iterator[Metric]:
        for name, value in self.slot.stats().items():
            if name in GAUGES:
                yield GaugeMetricFamily(PREFIX + name, f"replication: {name}", value=value)
            else:
                yield CounterMetricFamily(PREFIX + name, f"replication: {name}", value=value)
