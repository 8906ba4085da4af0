"""The gRPC services of the endpoint picker: ``envoy.service.ext_proc.v3.ExternalProcessor`` (one
``PickerStream`` per stream, at most ``EppSettings.max_streams`` at once, each message awaited under its
phase's deadline, ``phases``) and ``grpc.health.v1.Health`` for liveness (``liveness``, the empty name)
and readiness (``readiness`` and the ext_proc service's name: serving while any worker is available and
the picker is not stopping). The stream cap is the picker's own, not gRPC's, so that the health service
answers when every stream is taken."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from prefix_router.epp.phases import StreamClock
from prefix_router.epp.picker import Edge, PickerStream
from prefix_router.epp.settings import EXT_PROC_SERVICE
from prefix_router.node import Cause
from prefix_router.pool import Worker

log = logging.getLogger("prefix_router.epp")
LIVENESS = ("", "liveness")
READINESS = ("readiness", EXT_PROC_SERVICE)
WATCH_KEY = ""  # the picker's waits in the node's deadlines: no worker's (an ejection leaves them be)


class Processor(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    async def Process(
        self, requests: AsyncIterator[ext.ProcessingRequest], context: Any
    ) -> AsyncIterator[ext.ProcessingResponse]:
        edge = self.edge
        if edge.streams >= edge.settings.max_streams:
            edge.cut["stream_cap"] += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "the picker's stream cap is reached")
        stream = PickerStream(edge)
        edge.streams += 1
        try:
            async for answer in self.exchange(stream, aiter(requests)):
                yield answer
        except Exception:  # a bug: logged; the gateway applies its failure mode to the broken stream
            log.exception("ext_proc stream failed")
            raise
        finally:
            edge.streams -= 1
            stream.close()
        if stream.late:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the response did not arrive in time")

    async def exchange(
        self, stream: PickerStream, requests: AsyncIterator[ext.ProcessingRequest]
    ) -> AsyncIterator[ext.ProcessingResponse]:
        """The answers to ``requests``, each awaited under its phase's deadline; the stream ends when the
        gateway ends it or a deadline passes (then with the phase's answer, ``PickerStream.expired``)."""
        state = self.edge.state
        loop = asyncio.get_running_loop()
        clock = StreamClock(loop.time())
        while True:
            watch = state.deadlines.watch(WATCH_KEY, clock.deadline(state.config))
            try:
                async with watch:
                    message = await anext(requests)
            except StopAsyncIteration:
                return
            except TimeoutError:
                late = stream.expired(watch.cause is Cause.SHUTDOWN, clock.timeout_s(state.config))
                if late is not None:
                    yield late
                return
            for answer in await stream.answer(message):
                yield answer
            clock.moved(stream.phase, loop.time())


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
