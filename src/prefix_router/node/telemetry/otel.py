"""The OpenTelemetry SDK behind ``tracing``'s seam (the ``otel`` extra; imported only when tracing is on).

One server span ``prefix_router.request`` per request, a child of the client's W3C ``traceparent`` when
it sent one (``tracestate`` kept), with the events ``admitted``, ``keyed`` and ``decided`` (one per
attempt's choice); one client span ``prefix_router.upstream`` per upstream attempt, its child, with
``first_byte`` and ``stream_end`` events, whose own ``traceparent`` goes to the engine. Attributes: the
policy, branch, worker (its name, never its URL), predicted and engine-reported cached tokens, the key's
size, the tenant as a hash of its id, the status; never the prompt, a key or an address. Spans are
exported in batches by the SDK's own thread (``OTEL_BSP_*``) over OTLP/gRPC or OTLP/HTTP (protobuf).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
from collections.abc import Callable, Mapping
from types import ModuleType

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace import sampling as samplers
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from prefix_router.routing import Decision
from prefix_router.settings import ConfigError

SERVICE = "prefix-router"
SCOPE = "prefix_router"
REQUEST_SPAN = "prefix_router.request"
UPSTREAM_SPAN = "prefix_router.upstream"
TENANT_DOMAIN = b"prefix-router trace tenant\0"  # the tenant's hash is unrelated to its other uses
PROPAGATOR = TraceContextTextMapPropagator()
EXPORTERS = {  # by OTEL_EXPORTER_OTLP_PROTOCOL
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
}
# OTEL_TRACES_SAMPLER's values (the specification's), given OTEL_TRACES_SAMPLER_ARG (a ratio)
SAMPLERS: dict[str, Callable[[float], samplers.Sampler]] = {
    "always_on": lambda _: samplers.ALWAYS_ON,
    "always_off": lambda _: samplers.ALWAYS_OFF,
    "traceidratio": samplers.TraceIdRatioBased,
    "parentbased_always_on": lambda _: samplers.ParentBased(samplers.ALWAYS_ON),
    "parentbased_always_off": lambda _: samplers.ParentBased(samplers.ALWAYS_OFF),
    "parentbased_traceidratio": lambda ratio: samplers.ParentBased(samplers.TraceIdRatioBased(ratio)),
}


def sampler(env: Mapping[str, str]) -> samplers.Sampler:
    """``OTEL_TRACES_SAMPLER`` (``parentbased_always_on`` by default) with ``OTEL_TRACES_SAMPLER_ARG``."""
    name = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if name not in SAMPLERS:
        raise ConfigError(f"OTEL_TRACES_SAMPLER={name[:32]!r}: one of {', '.join(SAMPLERS)}")
    arg = env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
    try:
        ratio = float(arg)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG={arg[:32]!r}: a ratio from 0 to 1")
    return SAMPLERS[name](ratio)


def exporter_module(kind: str) -> ModuleType:
    """The module of the OTLP span exporter of ``kind`` (``tracing.PROTOCOLS``), imported."""
    return importlib.import_module(EXPORTERS[kind])


def exporter(url: str, kind: str, env: Mapping[str, str]) -> SpanExporter:
    """The OTLP exporter of ``kind`` to ``url``: used as it is when it is the traces' own endpoint, with
    ``/v1/traces`` after it over HTTP when it is the base one (as the specification says)."""
    if kind != "grpc" and not env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        url = url.rstrip("/") + "/v1/traces"
    made: SpanExporter = exporter_module(kind).OTLPSpanExporter(endpoint=url)
    return made


def build(env: Mapping[str, str], url: str, kind: str) -> OtelTracing:
    """The node's tracing from ``env`` (``tracing.from_env`` checked the endpoint and the protocol)."""
    name = env.get("OTEL_SERVICE_NAME", "").strip() or SERVICE
    provider = TracerProvider(
        sampler=sampler(env),
        resource=Resource.create({"service.name": name}),
        shutdown_on_exit=False,  # closed with the node (``OtelTracing.close``), not by an atexit hook
    )
    provider.add_span_processor(BatchSpanProcessor(exporter(url, kind, env)))
    return OtelTracing(provider)


def tenant_tag(tenant: str) -> str:
    """A tenant (its id, ``auth.tenant_of``) as spans show it: 16 hex digits of a hash of the id."""
    return hashlib.sha256(TENANT_DOMAIN + tenant.encode()).hexdigest()[:16]


class OtelTracing:
    """``tracing.Tracing`` over an SDK ``TracerProvider`` of the node's own (never the global one)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE)

    def start(
        self, headers: Mapping[str, str], method: str, path: str, request_id: str, tenant: str | None
    ) -> OtelRequest:
        return OtelRequest(self.tracer, headers, method, path, request_id, tenant)

    async def close(self) -> None:
        """Flush the spans still queued and stop the export thread (off the event loop: it blocks)."""
        await asyncio.to_thread(self.provider.shutdown)


class OtelRequest:
    """``tracing.RequestTrace``: one request's server span and its current upstream attempt's span. The
    SDK validates every attribute and event it is given (most of a span's cost): the request span's
    attributes are gathered here and set once, at its end; events carry none."""

    __slots__ = ("attempts", "attributes", "decision", "span", "tenant", "tracer", "upstream")

    def __init__(
        self,
        tracer: trace.Tracer,
        headers: Mapping[str, str],
        method: str,
        path: str,
        request_id: str,
        tenant: str | None,
    ) -> None:
        self.tracer = tracer
        parent = PROPAGATOR.extract(headers)  # the client's traceparent; an empty context without one
        started: dict[str, str] = {"http.request.method": method, "url.path": path}
        self.span = tracer.start_span(REQUEST_SPAN, parent, SpanKind.SERVER, started)
        self.attributes: dict[str, str | int | bool] = {"prefix_router.request_id": request_id}
        self.tenant = tenant  # hashed at the end, for a span that is recorded (sampled) only
        self.upstream: trace.Span | None = None
        self.decision: dict[str, str | int] = {}
        self.attempts = 0

    def stage(self, name: str) -> None:
        self.span.add_event(name)

    def keyed(self, key_tokens: int, blocks: int) -> None:
        self.span.add_event("keyed")
        self.attributes["prefix_router.key_tokens"] = key_tokens
        self.attributes["prefix_router.blocks"] = blocks

    def decided(self, policy: str, decision: Decision) -> None:
        self.span.add_event("decided")
        self.decision = {
            "prefix_router.policy": policy,
            "prefix_router.branch": str(decision.branch),
            "prefix_router.worker": decision.worker,
            "prefix_router.predicted_tokens": decision.predicted_tokens,
            "prefix_router.matched_blocks": decision.matched_blocks,
        }
        self.attributes.update(self.decision)  # the last choice: the one that served

    def attempt(self, worker: str) -> str:
        self.close_attempt()
        self.attempts += 1
        if not self.span.is_recording():  # sampled out: the trace goes on through this span, unrecorded
            return traceparent(self.span.get_span_context())
        attributes = {**self.decision, "prefix_router.worker": worker, "prefix_router.attempt": self.attempts}
        context = trace.set_span_in_context(self.span)
        self.upstream = self.tracer.start_span(UPSTREAM_SPAN, context, SpanKind.CLIENT, attributes)
        return traceparent(self.upstream.get_span_context())

    def attempt_failed(self, error: str, status: int | None) -> None:
        span = self.upstream
        if span is None:
            return
        failed: dict[str, str | int] = {"error.type": error}
        if status is not None:
            failed["http.response.status_code"] = status
        span.set_attributes(failed)
        span.set_status(Status(StatusCode.ERROR, error))
        self.close_attempt()

    def first_byte(self, status: int) -> None:
        if self.upstream is not None:
            self.upstream.add_event("first_byte")
            self.upstream.set_attribute("http.response.status_code", status)

    def answered(self, cached_tokens: int | None, ok: bool) -> None:
        if cached_tokens is not None:
            self.attributes["prefix_router.cached_tokens"] = cached_tokens
        self.attributes["prefix_router.ok"] = ok
        if self.upstream is not None:
            self.upstream.add_event("stream_end")
        self.close_attempt()

    def end(self, status: int, model: str) -> None:
        self.close_attempt()
        span = self.span
        if not span.is_recording():  # sampled out: nothing to set
            span.end()
            return
        attributes = self.attributes
        if self.tenant is not None:
            attributes["prefix_router.tenant"] = tenant_tag(self.tenant)
        attributes["http.response.status_code"] = status
        attributes["prefix_router.model"] = model
        attributes["prefix_router.attempts"] = self.attempts
        span.set_attributes(attributes)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    def close_attempt(self) -> None:
        if self.upstream is not None:
            self.upstream.end()
            self.upstream = None


def traceparent(context: trace.SpanContext) -> str:
    """The W3C ``traceparent`` header value of ``context`` (version 00)."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
