"""OpenTelemetry traces: the seam the request path calls (``RequestTrace``, ``Tracing``) and its switch.

Off by default. On when an OTLP endpoint is set in the environment, as every OpenTelemetry SDK reads it:
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``OTEL_EXPORTER_OTLP_PROTOCOL``
(or its ``_TRACES_`` form) picks ``grpc`` (the default) or ``http/protobuf``; ``OTEL_SERVICE_NAME`` names
the service (``prefix-router`` by default); ``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` sample
(``parentbased_always_on`` by default); ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn
it off again. The exporter's other standard variables (headers, certificates, timeout, compression,
``OTEL_BSP_*``) are the SDK's own. No configuration knob of the router's.

Off, the request path holds ``None`` (``NodeState.tracing``, ``RequestNote.trace``) and tests it at a few
points: no span, no OpenTelemetry import. On, ``otel.OtelTracing`` (the ``otel`` extra:
``pip install 'prefix-router[otel]'``) makes one server span per request, a child of the client's W3C
``traceparent``, with events for its stages and one client span per upstream attempt, whose
``traceparent`` goes to the engine. This module and ``otel`` stay out of the compiled build (setup.py):
the compiled request path calls the protocols below, whatever implements them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Protocol

from prefix_router.routing import Decision
from prefix_router.settings import ConfigError

TRACEPARENT = "traceparent"
PROTOCOLS = ("grpc", "http/protobuf")
INSTALL_HINT = "tracing needs the otel extra: pip install 'prefix-router[otel]'"
STALE_HINT = "run scripts/otel-protos.sh (the otel extra's opentelemetry-proto, reinstalled with --no-deps)"


class RequestTrace(Protocol):
    """One request's span. Its stages, in order: ``stage("admitted")``, ``keyed``, per attempt
    ``decided`` then ``attempt`` (then ``attempt_failed``, or ``first_byte`` and ``answered``), and
    ``end`` once, however it ends. Only names, counts and hashes reach it: never the prompt, a key or a
    worker's address."""

    def stage(self, name: str) -> None: ...

    def keyed(self, key_tokens: int, blocks: int) -> None: ...

    def decided(self, policy: str, decision: Decision) -> None: ...

    def attempt(self, worker: str) -> str:
        """Open the attempt's span on ``worker`` (a name); returns its ``traceparent`` for the engine."""
        ...

    def attempt_failed(self, error: str, status: int | None) -> None: ...

    def first_byte(self, status: int) -> None: ...

    def answered(self, cached_tokens: int | None, ok: bool) -> None:
        """The response is relayed whole (stream end); ``cached_tokens``: what the engine reported."""
        ...

    def end(self, status: int, model: str) -> None: ...


class Tracing(Protocol):
    """What makes the request spans (``NodeState.tracing``), closed with the node (its spans flushed)."""

    def start(
        self, headers: Mapping[str, str], method: str, path: str, request_id: str, tenant: str | None
    ) -> RequestTrace:
        """A request's span, a child of the client's ``traceparent`` in ``headers``; ``tenant``: its id."""
        ...

    async def close(self) -> None: ...


def endpoint(env: Mapping[str, str]) -> str | None:
    """The OTLP endpoint that turns tracing on (None: off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter == "none":
        return None
    if exporter != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER={exporter[:32]!r}: the router exports otlp or none")
    found = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return found.strip() or None if found else None


def protocol(env: Mapping[str, str]) -> str:
    value = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    value = value.strip().lower()
    if value not in PROTOCOLS:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={value[:32]!r}: one of {', '.join(PROTOCOLS)}")
    return value


def from_env(env: Mapping[str, str]) -> Callable[[], Tracing] | None:
    """What makes the node's tracing as ``env`` sets it, checked now (``ConfigError``: a bad value, or the
    ``otel`` extra missing) and called once the node starts (after ``serve --processes`` forked: the SDK's
    export thread belongs to the serving process); None (off, the default) without an OTLP endpoint."""
    url = endpoint(env)
    if url is None:
        return None
    kind = protocol(env)
    try:
        from prefix_router.node.telemetry import otel

        otel.exporter_module(kind)
    except ImportError as exc:
        raise ConfigError(missing(exc)) from None
    otel.sampler(env)
    return functools.partial(otel.build, dict(env), url, kind)


def missing(exc: ImportError) -> str:
    """What to do when the OpenTelemetry packages do not import: install the extra, or reinstall its protos
    (``InstrumentationScope`` missing: xds-protos' stale copy of the OTLP modules is over the extra's)."""
    if "InstrumentationScope" in str(exc):
        return f"the OTLP modules are xds-protos' stale copy: {STALE_HINT}"
    return f"{INSTALL_HINT} ({exc})"


def with_traceparent(headers: dict[str, str], value: str) -> dict[str, str]:
    """``headers`` (an upstream request's) carrying ``value`` as their one ``traceparent``: the client's,
    in whatever case it came, is replaced."""
    for name in [k for k in headers if k.lower() == TRACEPARENT]:
        del headers[name]
    headers[TRACEPARENT] = value
    return headers
