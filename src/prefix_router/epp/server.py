"""The endpoint picker as a running thing: the node's state and life (``node.build_app``: probes,
monitor, discovery, replication) with its control routes on the HTTP listener (``config.host``/``port``:
``/health``, ``/ready``, ``/metrics``, the admin API), and the gRPC listener (``EppSettings``) serving
ext_proc and health, both on one event loop (the routing core is single-threaded).

Stopping (SIGTERM/SIGINT, or ``RunningEpp.stop``): readiness turns NOT_SERVING, new streams are refused
(503 ``shutting_down`` for a request the gateway still sends), streams in flight get ``grace_s`` to end.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2_grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefix_router.epp.picker import Edge
from prefix_router.epp.service import Health, Processor
from prefix_router.epp.settings import EppSettings
from prefix_router.node import (
    STATE,
    Config,
    Reloader,
    Running,
    add_admin_routes,
    add_catch_all,
    add_control_routes,
    bind,
    build_app,
    reload_config,
    start,
)
from prefix_router.pool import Fetcher

log = logging.getLogger("prefix_router.epp")


def create_control_app(
    config: Config,
    *,
    fetcher: Fetcher | None = None,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> web.Application:
    """The router's state and life with the picker's HTTP routes (no ``/v1/*``: the data path is the
    gateway's)."""
    app = build_app(config, None, fetcher, clock, rng or random.Random(config.seed))
    add_control_routes(app)
    add_admin_routes(app)
    add_catch_all(app)
    return app


class StreamsCollector(Collector):
    """``prefix_router_epp_streams``: ext_proc streams open now (at most ``EppSettings.max_streams``);
    ``prefix_router_epp_messages_total{kind}``: ext_proc messages received (``Edge.messages``);
    ``prefix_router_epp_buffered_bytes``: body bytes held across streams (at most
    ``EppSettings.max_buffered_bytes``); ``prefix_router_epp_streams_cut_total{reason}``: streams the
    picker ended or refused (``Edge.cut``: a phase's deadline, the body budget, the stream cap)."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("prefix_router_epp_streams", "ext_proc streams open", value=self.edge.streams)
        messages = CounterMetricFamily(
            "prefix_router_epp_messages", "ext_proc messages received, by kind", labels=["kind"]
        )
        for kind, count in self.edge.messages.items():
            messages.add_metric([kind], count)
        yield messages
        yield GaugeMetricFamily(
            "prefix_router_epp_buffered_bytes", "body bytes held across streams", value=self.edge.buffered
        )
        cut = CounterMetricFamily(
            "prefix_router_epp_streams_cut",
            "ext_proc streams ended or refused by the picker",
            labels=["reason"],
        )
        for reason, count in self.edge.cut.items():
            cut.add_metric([reason], count)
        yield cut


@dataclass
class RunningEpp:
    http: Running
    grpc_server: grpc.aio.Server
    grpc_port: int
    edge: Edge
    health: Health

    async def stop(self) -> None:
        state = self.edge.state
        loop = asyncio.get_running_loop()
        state.deadlines.stop(loop.time() + self.edge.settings.grace_s)
        await self.health.update()
        await self.health.stop()
        await self.grpc_server.stop(self.edge.settings.grace_s)
        await self.http.stop()


async def start_epp(app: web.Application, settings: EppSettings) -> RunningEpp:
    """Serve ``app`` (``create_control_app``) on its configured HTTP address and the picker on
    ``settings``' gRPC address (port 0: any free one), in the running loop."""
    config = app[STATE].config
    if settings.grpc_port:  # taken: one line (ListenError) before anything starts, not grpcio's log
        for sock in bind(settings.grpc_host, settings.grpc_port):
            sock.close()
    http = await start(app, config.host, config.port, keepalive_timeout=config.timeouts.client_header_s)
    edge = Edge(app[STATE], settings)
    edge.state.metrics.registry.register(StreamsCollector(edge))
    health = Health(edge)
    # no SO_REUSEPORT: a second picker on the same port fails to start instead of sharing the streams;
    # no gRPC-wide cap: the stream cap is ext_proc's alone (``Processor``), health answers beyond it
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    ext_grpc.add_ExternalProcessorServicer_to_server(Processor(edge), server)
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    try:
        try:
            port = server.add_insecure_port(f"{settings.grpc_host}:{settings.grpc_port}")
        except RuntimeError:  # grpcio's bind failure
            raise OSError(
                f"{settings.grpc_host}:{settings.grpc_port}: address in use or not permitted"
            ) from None
        await server.start()
        await health.start()
    except BaseException:
        await server.stop(None)
        await http.stop()
        raise
    return RunningEpp(http, server, port, edge, health)


async def serve_epp(
    config: Config, settings: EppSettings, load: Callable[[], Config] | None = None, source: str = "flags"
) -> None:
    """Run until SIGTERM or SIGINT; SIGHUP reloads with ``load`` as ``serve`` does (``node.reload_config``:
    workers, auth, routing knobs, limits; the rest named as needing a restart)."""
    running = await start_epp(create_control_app(config), settings)
    log.info(
        "event=serving_epp grpc=%s:%d http=%s workers=%d policy=%s",
        settings.grpc_host,
        running.grpc_port,
        running.http.url.replace("127.0.0.1", config.host),
        len(running.edge.state.pool),
        config.routing.policy,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    state = running.edge.state

    async def reloaded() -> None:
        if load is not None:
            await reload_config(state, load, source)

    loop.add_signal_handler(signal.SIGHUP, Reloader(loop, reloaded if load is not None else None).signal)
    try:
        await stop.wait()
        log.info(
            "shutting down: %d ext_proc streams open (up to %.1fs)", running.edge.streams, settings.grace_s
        )
    finally:
        await running.stop()
