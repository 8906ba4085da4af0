"""Reading and validating a client request: body size, JSON, fields, routing key."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import StreamReader, hdrs, web
from aiohttp.http import HttpVersion11

from prefix_router.node.request import decoding
from prefix_router.node.request.errors import ProxyError, bad_request
from prefix_router.protocol import Endpoint
from prefix_router.routing import InvalidRequest, KeyBuilder, RouteRequest

log = logging.getLogger(__name__)
MAX_SESSION_CHARS = 128
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass(init=False, slots=True)  # a written __init__, compiled: see routing/types.py
class Parsed:
    """A routable request: the raw bytes to forward and what the router made of them."""

    endpoint: Endpoint
    raw: bytes
    body: dict[str, Any]
    req: RouteRequest
    stream: bool
    tenant: str | None
    engine_salt: str | None = None  # the cache_salt the proxy adds for the engine (precise keys)

    def __init__(
        self,
        endpoint: Endpoint,
        raw: bytes,
        body: dict[str, Any],
        req: RouteRequest,
        stream: bool,
        tenant: str | None,
        engine_salt: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.raw = raw
        self.body = body
        self.req = req
        self.stream = stream
        self.tenant = tenant
        self.engine_salt = engine_salt


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The body, refusing more than ``limit`` bytes with 413 and a body slower than ``timeout_s``
        (slowloris) with 408. A body in an encoding of ``decoding.ENCODINGS`` is decoded as it arrives, the
        limit counting wire and decoded bytes alike: 413 (and the connection closed) once either passes it,
        without decoding further; 400 ``invalid_encoding`` when it does not decode. A client that asked for
    ``100 Continue`` gets it here (``send_continue``), after the checks made before (credentials) and the
    declared size's."""
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    await send_continue(request)
    encoding = request.headers.get("Content-Encoding")
    content = request.content
    if content.is_eof() and not decoding.decodes(encoding):
        # all of it came with the head: nothing to wait for (no timer: arming one costs about 10 us), one join
        raw = content.read_nowait()
        if len(raw) > limit:
            raise too_large(limit)
        return raw
    try:
        async with asyncio.timeout(timeout_s):
            if decoding.decodes(encoding):
                return await read_decoded(content, decoding.Bounded(encoding or "", limit), limit)
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(limit) from None
    except TimeoutError:
        raise too_slow(timeout_s) from None
    if len(raw) > limit:
        raise too_large(limit)
    return raw


async def send_continue(request: web.BaseRequest) -> None:
    """``100 Continue`` to an HTTP/1.1 request that asked for it, before its body is read: only when
    nothing was written yet and the body has not come whole."""
    if (
        request.version == HttpVersion11
        and request.headers.get(hdrs.EXPECT, "").lower() == "100-continue"
        and request.writer.output_size == 0
        and not request.content.is_eof()
    ):
        await request.writer.write(CONTINUE)
        request.writer.output_size = 0  # as aiohttp does: the answer itself has not started


async def read_decoded(content: StreamReader, decoder: decoding.Bounded, limit: int) -> bytes:
    """The decoded body, step by step (the event loop gets a turn between steps)."""
    out = bytearray()
    wire = 0
    try:
        while True:
            chunk = await content.readany()
            wire += len(chunk)
            if wire > limit:
                raise too_large(limit)
            decoder.feed(chunk)
            while (piece := decoder.step()) is not None:
                out += piece
                await asyncio.sleep(0)
            if not chunk:
                decoder.finish()
                return bytes(out)
    except decoding.TooLarge:
        raise too_large(limit) from None
    except decoding.BadEncoding as exc:
        message = f"the body is not valid {decoder.encoding} ({exc})"
        raise bad_request(message, param="Content-Encoding", code="invalid_encoding") from None


def too_large(limit: int) -> ProxyError:
    """413; the connection is closed after it (the rest of the body is not read, nor decoded)."""
    return ProxyError(413, f"request body over {limit} bytes", code="request_too_large", close=True)


def check_encoding(headers: Mapping[str, str]) -> None:
    """415 for a body the router must read (a generation request's) in a ``Content-Encoding`` it does not
    decode (``decoding.ENCODINGS``) other than ``identity``: never read as if it were none. The connection
    is closed after it (the body is not read)."""
    encoding = headers.get("Content-Encoding")
    if encoding is None or decoding.decodes(encoding) or encoding.strip().lower() == "identity":
        return
    known = ", ".join(sorted(decoding.ENCODINGS))
    message = f"unsupported Content-Encoding (supported: {known}, identity)"
    raise ProxyError(415, message, param="Content-Encoding", code="unsupported_encoding", close=True)


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
    engine_salt: str | None = None,
) -> RouteRequest:
    """The routing core's view of the request; invalid bodies become 400 naming the field."""
    try:
        return builder.build(
            endpoint, body, route_id=request_id, tenant=tenant, session=session, engine_salt=engine_salt
        )
    except InvalidRequest as exc:
        raise bad_request(exc.message, param=exc.param, code="invalid_request") from None
    except Exception as error:  # never a 500 for a body we could not read
        log.warning("routing key failed for %s: %s", request_id, type(error).__name__)
        raise bad_request("could not read the request body", code="invalid_request") from None


def parse(
    endpoint: Endpoint,
    raw: bytes,
    builder: KeyBuilder,
    request_id: str,
    tenant: str | None,
    session: str | None,
    engine_salt: str | None = None,
) -> Parsed:
    body = parse_json(raw)
    stream = stream_flag(body)
    req = route_request(endpoint, body, builder, request_id, tenant, session, engine_salt)
    return Parsed(endpoint, raw, body, req, stream, tenant, engine_salt)


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
