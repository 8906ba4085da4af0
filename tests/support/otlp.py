"""An OTLP trace receiver started by a test: the collector's ``TraceService`` over gRPC (``grpc.aio``) or
``POST /v1/traces`` over HTTP (aiohttp, protobuf bodies), on a free loopback port. It keeps every export
request as it came (``raw``: to search for what must never be in a span) and its spans decoded (``spans``).
The environment that points the router at it: ``env``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as service
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as service_grpc
from opentelemetry.proto.common.v1 import common_pb2

from prefix_router.node.life.server import Running, start

SERVER_KIND, CLIENT_KIND = 2, 3  # the span kinds of the OTLP protocol's enum
ERROR_STATUS = 2


@dataclass
class Span:
    """One received span: ids as lower-case hex (``parent``: empty for a root)."""

    name: str
    trace_id: str
    span_id: str
    parent: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status: int
    service: str

    def event(self, name: str) -> dict[str, Any]:
        """The attributes of the event named ``name`` (the last one of that name)."""
        found = [attributes for event, attributes in self.events if event == name]
        assert found, f"no event {name!r} in {[e for e, _ in self.events]}"
        return found[-1]


def value(any_value: common_pb2.AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: value(pair.value) for pair in pairs}


def spans_of(request: service.ExportTraceServiceRequest) -> list[Span]:
    out = []
    for resource_spans in request.resource_spans:
        name = attributes(resource_spans.resource.attributes).get("service.name", "")
        for scope in resource_spans.scope_spans:
            for span in scope.spans:
                out.append(
                    Span(
                        span.name,
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        span.kind,
                        attributes(span.attributes),
                        [(e.name, attributes(e.attributes)) for e in span.events],
                        span.status.code,
                        name,
                    )
                )
    return out


@dataclass
class Receiver:
    protocol: str  # "grpc" or "http/protobuf"
    raw: list[bytes] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    url: str = ""
    _server: Any = None
    _running: Running | None = None

    def take(self, request: service.ExportTraceServiceRequest) -> None:
        self.raw.append(request.SerializeToString())
        self.spans.extend(spans_of(request))

    @property
    def env(self) -> dict[str, str]:
        """The variables that make a router export to this receiver, soon after each span ends."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": self.protocol,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }

    async def start(self) -> Receiver:
        if self.protocol == "grpc":
            self._server = grpc.aio.server()
            service_grpc.add_TraceServiceServicer_to_server(Servicer(self), self._server)
            port = self._server.add_insecure_port("127.0.0.1:0")
            await self._server.start()
            self.url = f"http://127.0.0.1:{port}"
        else:
            app = web.Application()
            app.router.add_post("/v1/traces", self._http)
            self._running = await start(app)
            self.url = self._running.url
        return self

    async def _http(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        self.take(service.ExportTraceServiceRequest.FromString(await request.read()))
        body = service.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
        if self._running is not None:
            await self._running.stop()

    async def wait(self, count: int, name: str | None = None, timeout_s: float = 20.0) -> list[Span]:
        """The spans received (named ``name``, if given) once there are ``count`` of them."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        while True:
            found = [s for s in self.spans if name is None or s.name == name]
            if len(found) >= count or loop.time() > until:
                assert len(found) >= count, f"{len(found)} spans named {name!r}, {count} expected"
                return found
            await asyncio.sleep(0.05)


class Servicer(service_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    async def Export(
        self, request: service.ExportTraceServiceRequest, context: Any
    ) -> service.ExportTraceServiceResponse:
        self.receiver.take(request)
        return service.ExportTraceServiceResponse()
