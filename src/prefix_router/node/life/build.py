"""``build_app(config, ...)``: the node as an aiohttp application without routes: its state (``NodeState``)
built from the configuration, and its life: start-up probes, the monitor, discovery, replication, the
KV event subscriptions and the health hooks. Whatever carries its requests adds its routes (``proxy``:
the OpenAI surface; ``epp``: the control routes beside its gRPC edge)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from prefix_router.node.config import Config
from prefix_router.node.request.auth import Credentials
from prefix_router.node.state import STATE, NodeState
from prefix_router.node.telemetry import logs, tracing
from prefix_router.node.telemetry.metrics import ProxyMetrics
from prefix_router.node.telemetry.record import TraceRecorder
from prefix_router.node.upstream.http_client import HttpUpstream
from prefix_router.node.upstream.seam import Upstream
from prefix_router.pool import (
    AiohttpFetcher,
    Fetcher,
    HealthSettings,
    PoolError,
    PoolMonitor,
    ScrapeSettings,
    Worker,
    WorkerPool,
)
from prefix_router.routing import Router
from prefix_router.settings import ConfigError

log = logging.getLogger("prefix_router.proxy")
EVENTS_SYNC_S = 1.0


def build_app(
    config: Config,
    upstream: Upstream | None,
    fetcher: Fetcher | None,
    clock: Callable[[], float],
    rng: random.Random,
) -> web.Application:
    """The node's state and its life, without routes: start-up probes, the monitor, discovery,
    replication and the health hooks. ``upstream`` and ``fetcher`` replace the network (tests); ``rng``
    the random source."""
    state = build_state(config, upstream, fetcher, clock, rng)
    app = web.Application(client_max_size=config.limits.max_body_bytes)
    app[STATE] = state
    app.on_startup.append(_startup)
    app.on_shutdown.append(_shutdown)
    app.on_cleanup.append(_cleanup)
    _install_replication(app, state)
    _install_discovery(app, state)
    _install_events(app, state)
    _install_tracing(app, state)
    state.pool.on_health_change(_log_health)
    state.pool.on_health_change(_ejection_cutter(state))
    return app


def build_state(
    config: Config,
    upstream: Upstream | None,
    fetcher: Fetcher | None,
    clock: Callable[[], float],
    rng: random.Random,
) -> NodeState:
    router = build_router(config, rng)
    pool = build_pool(config, router)
    metrics = ProxyMetrics(pool, router)
    return NodeState(
        config=config,
        router=router,
        pool=pool,
        monitor=PoolMonitor(pool, router, fetcher or AiohttpFetcher(), monitor_settings(config), clock),
        metrics=metrics,
        upstream=upstream or build_upstream(config),
        client_credentials=Credentials(config.auth.api_keys),
        admin_token=Credentials([config.auth.admin_token] if config.auth.admin_token else []),
        clock=clock,
        policies=frozenset(router.policy_names()),
        recorder=build_recorder(config, clock, metrics),
        log_handler=logs.line_handler(),
    )


def monitor_settings(config: Config) -> tuple[HealthSettings, ScrapeSettings, int]:
    return config.health, config.scrape, config.limits.max_models_per_worker


def build_router(config: Config, rng: random.Random) -> Router:
    try:
        return Router(config.routing, rng=random.Random(rng.getrandbits(64)))
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"invalid config: routing: {str(exc).strip(chr(34) + chr(39))}") from None


def build_upstream(config: Config) -> HttpUpstream:
    """The upstream client: pooled keep-alive HTTP/1.1, parsed by llhttp (``upstream.http_client``)."""
    return HttpUpstream(config.timeouts.connect_s, max_idle_per_host=config.limits.max_idle_connections)


def build_pool(config: Config, router: Router) -> WorkerPool:
    thresholds = (config.health.fail_threshold, config.health.success_threshold)
    pool = WorkerPool(router, config.limits.max_workers, thresholds)
    for worker in config.workers:
        try:
            pool.add(worker)
        except PoolError as exc:
            raise ConfigError(f"invalid config: workers: {exc}") from None
    return pool


def build_recorder(config: Config, clock: Callable[[], float], metrics: ProxyMetrics) -> TraceRecorder | None:
    if config.record.file is None:
        return None
    return TraceRecorder(config.record, clock, metrics.record_dropped.inc)


async def _startup(app: web.Application) -> None:
    state = app[STATE]
    timeout = state.config.health.timeout_s * 3 + 1
    try:
        await asyncio.wait_for(state.monitor.refresh_all(), timeout)
    except TimeoutError:
        log.warning("start-up identification and probes did not finish within %.1fs; continuing", timeout)
    state.monitor.start()
    if state.recorder is not None:
        state.recorder.start()


async def _shutdown(app: web.Application) -> None:
    """The listener is closed. After ``serve``'s graceful shutdown (``lifecycle.shutdown``, SIGTERM)
    nothing is left to wait for; an app stopped without one (``server.start``'s ``Running.stop``) gives
    what runs ``timeouts.shutdown_s``."""
    state = app[STATE]
    if not state.deadlines.stopping:
        state.deadlines.stop(asyncio.get_running_loop().time() + state.config.timeouts.shutdown_s)
        log.info("shutting down: draining %d in-flight requests", state.pool.total_in_flight())


def _ejection_cutter(state: NodeState) -> Callable[[Worker, bool], None]:
    """When a worker is ejected, requests waiting for its first byte are retried elsewhere at once, and
    its streams end unless they show a chunk within every ``health.timeout_s`` (see ``Deadlines``)."""

    def cut(worker: Worker, healthy: bool) -> None:
        if not healthy:
            now, grace = asyncio.get_running_loop().time(), state.config.health.timeout_s
            state.deadlines.eject(worker.name, now, grace)

    return cut


async def _cleanup(app: web.Application) -> None:
    state = app[STATE]
    await state.monitor.stop()
    if state.recorder is not None:
        await state.recorder.close()
    if isinstance(state.upstream, HttpUpstream):
        await state.upstream.close()
    fetcher = state.monitor.fetcher
    if isinstance(fetcher, AiohttpFetcher):
        await fetcher.close()


def _install_events(app: web.Application, state: NodeState) -> None:
    """KV cache event subscriptions (precise mode) for the workers with ``kv_events``, kept in step with
    the pool every ``EVENTS_SYNC_S`` (admin and discovery changes); started after the first
    identification (a worker's model names its blocks), stopped on cleanup."""
    from prefix_router.node.request.render import MAX_RENDERED, RenderCollector, Renders
    from prefix_router.pool import EventSubscriptions, KvEventsCollector

    subs = EventSubscriptions(state.pool, state.router, state.clock)
    state.events = subs
    state.metrics.registry.register(KvEventsCollector(subs))
    state.renders = Renders(MAX_RENDERED)
    state.metrics.registry.register(RenderCollector(state.renders))

    async def keep_in_step() -> None:
        while True:
            await asyncio.sleep(EVENTS_SYNC_S)
            try:
                await subs.sync()
            except Exception:
                log.exception("kv events: sync with the pool failed")

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        await subs.sync()
        task = asyncio.create_task(keep_in_step())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await subs.close()

    app.cleanup_ctx.append(lifetime)


def _install_tracing(app: web.Application, state: NodeState) -> None:
    """OpenTelemetry traces when the environment names an OTLP endpoint (``telemetry.tracing``): checked
    now, made on start-up, flushed and stopped on cleanup."""
    make = tracing.from_env(os.environ)
    if make is None:
        return

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        state.tracing = make()
        yield
        made, state.tracing = state.tracing, None
        if made is not None:
            await made.close()

    app.cleanup_ctx.append(lifetime)


def _log_health(worker: Worker, healthy: bool) -> None:
    if healthy and not worker.health.ejections:
        log.info("worker %s admitted (its first probe passed)", worker.name)
    elif healthy:
        log.warning("worker %s re-admitted", worker.name)
    else:
        log.warning("worker %s ejected: %s", worker.name, worker.health.last_error)


def _install_replication(app: web.Application, state: NodeState) -> None:
    settings = state.config.replication
    if settings.url is None:
        return
    from prefix_router.replication import ReplicationCollector, install

    slot = install(app, state.router, settings, clock=state.clock)
    state.metrics.registry.register(ReplicationCollector(slot))
    state.replication_stats = slot.stats


def _install_discovery(app: web.Application, state: NodeState) -> None:
    """Workers from ``discovery:`` join and leave the pool; runs first on start-up (so the replication's
    warm-up knows the workers) and stops first on cleanup (before the monitor's fetcher closes)."""
    settings = state.config.discovery
    if settings.kind is None:
        return
    from prefix_router.pool import DiscoveryCollector, WorkerDiscovery

    found = WorkerDiscovery(settings, state.pool, state.config.limits.max_workers, state.monitor.refresh)

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        await found.start()
        yield
        await found.stop()

    app.cleanup_ctx.append(lifetime)
    state.metrics.registry.register(DiscoveryCollector(found))
