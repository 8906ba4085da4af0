"""Reading and validating a client request: body size, JSON, fields, routing key."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from prefix_router.protocol import Endpoint
from prefix_router.proxy.edge.errors import ProxyError, bad_request
from prefix_router.routing import InvalidRequest, KeyBuilder, RouteRequest

log = logging.getLogger(__name__)
MAX_SESSION_CHARS = 128


@dataclass(slots=True)
class Parsed:
    """A routable request: the raw bytes to forward and what the router made of them."""

    endpoint: Endpoint
    raw: bytes
    body: dict[str, Any]
    route: RouteRequest
    stream: bool
    tenant: str | None


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The raw body, refusing more than ``limit`` bytes with 413 and a body slower than ``timeout_s``
    (slowloris) with 408."""
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    try:
        content = request.content
        if content.is_eof():  # all of it came with the head: nothing to wait for, one join
            raw = content.read_nowait()
        else:
            async with asyncio.timeout(timeout_s):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(limit) from None
    except TimeoutError:
        raise too_slow(timeout_s) from None
    if len(raw) > limit:
        raise too_large(limit)
    return raw


def too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"request body over {limit} bytes", code="request_too_large")


def too_slow(timeout_s: float) -> ProxyError:
    return ProxyError(408, f"request body not received within {timeout_s:g} s", code="request_timeout")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or 400."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"invalid JSON body: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    return body


def stream_flag(body: dict[str, Any]) -> bool:
    value = body.get("stream", False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request("'stream' must be a boolean", param="stream", code="invalid_type")
    return value


def route_request(
    endpoint: Endpoint,
    body: dict[str, Any],
    builder: KeyBuilder,
    request_id: str,
    tenant: str | None,
    session: str | None,
) -> RouteRequest:
    """The routing core's view of the request; invalid bodies become 400 naming the field."""
    try:
        return builder.build(endpoint, body, route_id=request_id, tenant=tenant, session=session)
    except InvalidRequest as exc:
        raise bad_request(exc.message, param=exc.param, code="invalid_request") from None
    except Exception as exc:  # never a 500 for a body we could not read
        log.warning("routing key failed for %s: %s", request_id, type(exc).__name__)
        raise bad_request("could not read the request body", code="invalid_request") from None


def parse(
    endpoint: Endpoint,
    raw: bytes,
    builder: KeyBuilder,
    request_id: str,
    tenant: str | None,
    session: str | None,
) -> Parsed:
    body = parse_json(raw)
    stream = stream_flag(body)
    route = route_request(endpoint, body, builder, request_id, tenant, session)
    return Parsed(endpoint, raw, body, route, stream, tenant)


def session_id(value: str | None, tenant: str | None = None) -> str | None:
    """The session header's value, long ones reduced to a digest so the router's map stays small.

    With a tenant (tenants isolated), the id is scoped to it: another tenant sending the same session id
    can neither follow nor redirect this tenant's sticky routing."""
    if not value:
        return None
    if tenant is None and len(value) <= MAX_SESSION_CHARS:
        return value
    scoped = value if tenant is None else f"{tenant}\0{value}"
    return hashlib.blake2b(scoped.encode("utf-8", "replace"), digest_size=16).hexdigest()


def body_model(raw: bytes, content_type: str) -> str | None:
    """The ``model`` of a JSON body of a pass-through request, if it has one."""
    if not raw or "json" not in content_type:
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None
