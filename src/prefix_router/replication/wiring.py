"""Plugging the shared state into an aiohttp router app: ``install(app, router, url)`` adds start-up and
clean-up hooks and returns a slot whose ``ready()`` the ``/ready`` handler may consult; ``StateCollector``
maps the state's counters to Prometheus metrics.

aiohttp runs ``on_startup`` hooks before it accepts connections, so the warm-up from the stream backlog is
over before a probe can reach ``/ready``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Protocol

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefix_router.replication.config import StateConfig
from prefix_router.replication.connect import attach
from prefix_router.replication.sync import Clock, RedisState
from prefix_router.routing.router import Router

GAUGES = frozenset({"outbox_size", "connected", "warmed", "ready", "remote_replicas", "warmup_seconds"})
PREFIX = "prefix_router_state_"


class StateSlot:
    """Holds the app's :class:`RedisState` once started (filled by the start-up hook)."""

    def __init__(self) -> None:
        self.state: RedisState | None = None

    def ready(self) -> bool:
        return self.state is not None and self.state.ready

    def stats(self) -> dict[str, float]:
        return self.state.stats() if self.state is not None else {}


def install(
    app: web.Application,
    router: Router,
    url: str,
    *,
    replica_id: str | None = None,
    cfg: StateConfig | None = None,
    clock: Clock = time.monotonic,
) -> StateSlot:
    """Share ``router``'s state through the Redis at ``url`` for the app's lifetime."""
    slot = StateSlot()

    async def start(_: web.Application) -> None:
        slot.state = await attach(router, url, replica_id, cfg, clock=clock)

    async def stop(_: web.Application) -> None:
        if slot.state is not None:
            await slot.state.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return slot


class HasStats(Protocol):
    def stats(self) -> dict[str, float]: ...


class StateCollector(Collector):
    """``prefix_router_state_<counter>_total`` counters and ``prefix_router_state_<gauge>`` gauges, from a
    ``StateSlot`` (Redis) or a ``LocalState`` (``serve --processes``)."""

    def __init__(self, slot: HasStats) -> None:
        self.slot = slot

    def collect(self) -> Iterator[Metric]:
        for name, value in self.slot.stats().items():
            if name in GAUGES:
                yield GaugeMetricFamily(PREFIX + name, f"shared state: {name}", value=value)
            else:
                yield CounterMetricFamily(PREFIX + name, f"shared state: {name}", value=value)
