"""The gRPC services of the endpoint picker: ``envoy.service.ext_proc.v3.ExternalProcessor`` (one
``PickerStream`` per stream) and ``grpc.health.v1.Health`` for liveness (``liveness``, the empty name) and
readiness (``readiness`` and the ext_proc service's name: serving while any worker is available and the
picker is not stopping)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from prefix_router.epp.picker import Edge, PickerStream
from prefix_router.epp.settings import EXT_PROC_SERVICE
from prefix_router.pool import Worker

log = logging.getLogger("prefix_router.epp")
LIVENESS = ("", "liveness")
READINESS = ("readiness", EXT_PROC_SERVICE)


class Processor(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    async def Process(
        self, requests: AsyncIterator[ext.ProcessingRequest], context: Any
    ) -> AsyncIterator[ext.ProcessingResponse]:
        stream = PickerStream(self.edge)
        self.edge.streams += 1
        try:
            async for message in requests:
                for answer in await stream.answer(message):
                    yield answer
        except Exception:  # a bug: logged; the gateway applies its failure mode to the broken stream
            log.exception("ext_proc stream failed")
            raise
        finally:
            self.edge.streams -= 1
            stream.close()


class Health:
    """The health service and the readiness it reports, kept current by the pool's health changes."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge
        self.servicer = HealthServicer()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        for name in LIVENESS:
            await self.servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        await self.update()
        self.edge.state.pool.on_health_change(self._changed)

    def ready(self) -> bool:
        state = self.edge.state
        return not state.deadlines.stopping and any(w.available for w in state.pool)

    async def update(self) -> None:
        serving = (
            health_pb2.HealthCheckResponse.SERVING
            if self.ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in READINESS:
            await self.servicer.set(name, serving)

    def _changed(self, worker: Worker, healthy: bool) -> None:
        task = asyncio.get_running_loop().create_task(self.update())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        await self.servicer.enter_graceful_shutdown()
