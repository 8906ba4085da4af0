"""A routed request's body (chat or completions) keyed as both edges key it: parsed with the tenant, the
session and the cache salt the engine will see, off the event loop when long, then, in precise mode
without a local template, its token ids rendered by an event-fed engine (``render``). ``serve``'s
handlers and the endpoint picker (``prefix_router.epp``) both call ``parse_routed``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from prefix_router.node.request import parse as parsing
from prefix_router.node.request.auth import tenant_of, tenant_salt
from prefix_router.node.request.render import RENDER_TIMEOUT_S, render_worker
from prefix_router.node.state import NodeState
from prefix_router.protocol import Endpoint


async def parse_routed(
    state: NodeState, endpoint: Endpoint, raw: bytes, headers: Mapping[str, str]
) -> parsing.Parsed:
    """``raw`` parsed and keyed for the routing core (``ProxyError`` 400 when it is not a valid body);
    ``headers`` are the client's (tenant, session, cache salt)."""
    config = state.request_config
    tenant = tenant_of(headers) if config.isolate_tenants else None
    session = parsing.session_id(headers.get(config.session_header), tenant)
    salt = tenant_salt(headers) if config.cache_salt else None  # as the engine sees it
    args = (endpoint, raw, state.router.keys, state.next_id(), tenant, session, salt)
    threshold = (
        config.template_parse_in_thread_bytes if state.router.keys.templates else config.parse_in_thread_bytes
    )
    if len(raw) > threshold:  # long parses (and exact-mode keys) stay off the event loop
        parsed = await asyncio.to_thread(parsing.parse, *args)
    else:
        parsed = parsing.parse(*args)
    if not render_due(state, parsed):  # checked before awaiting: one coroutine less on every request
        return parsed
    return await rendered(state, parsed, salt)


def render_due(state: NodeState, parsed: parsing.Parsed) -> bool:
    """Whether ``rendered`` would have an engine render ``parsed``'s precise key: it has none, rendering is
    on and the router routes on events."""
    return not (
        state.renders is None
        or not state.request_config.render
        or parsed.req.precise_blocks
        or not state.router.precise
    )


async def rendered(state: NodeState, parsed: parsing.Parsed, salt: str | None) -> parsing.Parsed:
    """``parsed`` with a precise key rendered by an event-fed engine when it has none (``render.py``)."""
    if state.renders is None or not render_due(state, parsed):
        return parsed
    model = parsed.body.get("model")
    workers = [w for w in state.pool if w.available and isinstance(model, str) and w.serves(model)]
    worker = render_worker(state.router, workers, state.clock())
    return await state.renders.precise(state.router, state.upstream, worker, parsed, RENDER_TIMEOUT_S, salt)
