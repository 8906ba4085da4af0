"""The node's own HTTP routes, the same whatever carries its requests: ``/health`` (the process is up),
``/ready`` (not stopping, at least one worker available: 503 otherwise; both say ``degraded`` under
``serve --processes`` while fewer processes run than configured), ``/metrics`` (Prometheus text),
and the catch-all that answers every other path (404) or method (405) in the OpenAI error shape, noted
like every request (request id, access log, ``prefix_router_requests_total``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from prefix_router.node.control import http_errors
from prefix_router.node.request.access import RequestNote, request_id
from prefix_router.node.request.errors import ProxyError
from prefix_router.node.state import STATE, NodeState
from prefix_router.node.steps.accounting import CLIENT_GONE, request_closed
from prefix_router.protocol import REQUEST_ID_HEADER

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def health(request: web.Request) -> web.StreamResponse:
    return json_response(with_processes(request.app[STATE], {"status": "ok"}))


async def ready(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if state.deadlines.stopping:
        return ProxyError(503, "shutting down", type="service_unavailable", code="shutting_down").response()
    up = sum(1 for w in state.pool if w.available)
    if up == 0:
        return ProxyError(503, "no healthy worker", type="service_unavailable", code="not_ready").response()
    return json_response(with_processes(state, {"status": "ready", "workers_available": up}))


def with_processes(state: NodeState, body: dict[str, object]) -> dict[str, object]:
    """``body``, and under ``serve --processes`` the processes running and configured: ``status`` is
    ``degraded`` while fewer run (a child that exited and waits for its restart budget)."""
    if state.processes is None:
        return body
    running, configured = state.processes()
    body["processes"] = {"running": running, "configured": configured}
    if running < configured:
        body["status"] = "degraded"
    return body


async def metrics(request: web.Request) -> web.StreamResponse:
    return web.Response(
        body=request.app[STATE].metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def not_routed(request: web.Request) -> web.StreamResponse:
    """``http_errors.not_routed``'s 404 or 405, with the request's id, counted and logged once."""
    state = request.app[STATE]
    note = RequestNote(
        request_id(request.headers) or state.next_request_id(),
        request.method,
        request.rel_url.raw_path,
        state.clock(),
    )
    state.active += 1
    status = CLIENT_GONE
    try:
        response = await http_errors.not_routed(request)
        status = response.status
        response.headers[REQUEST_ID_HEADER] = note.request_id
        if state.deadlines.stopping:
            response.force_close()  # the client reconnects, to a replica that is not stopping
        return response
    finally:
        state.active -= 1
        request_closed(state, note, status)


def add_routes(app: web.Application) -> None:
    """``/health``, ``/ready`` and ``/metrics``."""
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)


def add_catch_all(app: web.Application) -> None:
    """``not_routed`` for every path and method: call after every other route."""
    http_errors.add_catch_all(app, not_routed)
