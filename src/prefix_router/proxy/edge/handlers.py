"""HTTP handlers of the OpenAI-compatible surface. Each one is: admit, parse, then an ``Exchange``; each is
``guarded``: it gets the request as an ``EdgeRequest`` and a ``RequestNote`` (request id, access log,
``prefix_router_requests_total``), and ``answer`` turns what it returns or raises into the answer."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from prefix_router.protocol import POLICY_HEADER, REQUEST_ID_HEADER, Endpoint
from prefix_router.node.state import CONTEXT, AppContext
from prefix_router.node.control import http_errors
from prefix_router.node.request import parse as parsing
from prefix_router.node.request.access import RequestNote, log_access, request_id
from prefix_router.node.steps.accounting import CLIENT_GONE
from prefix_router.node.request.auth import check_client
from prefix_router.node.request.errors import ProxyError, bad_request, overloaded, shutting_down
from prefix_router.proxy.edge.exchange import Exchange, UpstreamReply
from prefix_router.node.request.forward import ROOT_PASSTHROUGH
from prefix_router.node.steps.keying import parse_routed
from prefix_router.proxy.edge.request import AiohttpRequest, EdgeRequest

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
NotedHandler = Callable[[EdgeRequest, RequestNote], Awaitable[web.StreamResponse]]


def guarded(handler: NotedHandler) -> Handler:
    """aiohttp's handler of ``handler``: the request seen as an ``AiohttpRequest``, then ``answer``."""

    async def wrapper(request: web.Request) -> web.StreamResponse:
        return await answer(AiohttpRequest(request.app[CONTEXT], request), handler)

    return wrapper


async def answer(request: EdgeRequest, handler: NotedHandler) -> web.StreamResponse:
    """Give the request its ``RequestNote``; turn errors into responses: a ``ProxyError`` into its OpenAI
    error (counted in ``prefix_router_rejected_total``), an ``UpstreamReply`` into its response, anything
    else into a logged 500; close the note with the status the client got (499 when it left), once."""
    state = request.state
    rid = request_id(request.headers) or state.next_request_id()
    note = RequestNote(rid, request.method, request.path, state.clock())
    state.active += 1
    status = CLIENT_GONE
    try:
        try:  # the errors mapped here, not in a coroutine of their own: one layer less per request
            response = await handler(request, note)
        except ProxyError as err:
            state.metrics.rejected.inc((str(err.status),))
            response = err.response()
        except UpstreamReply as reply:
            response = reply.response
        except Exception:
            response = internal_error(request, note)
        status = note.status or response.status
        if not response.prepared:
            response.headers[REQUEST_ID_HEADER] = note.request_id
            if state.deadlines.stopping:
                response.force_close()  # the client reconnects, to a replica that is not stopping
        return response
    finally:
        state.active -= 1
        closed(state, note, status)


def internal_error(request: EdgeRequest, note: RequestNote) -> web.Response:
    """A bug, not the client's fault: still an OpenAI-shaped answer (500), and logged with its traceback
    (call it inside the ``except``)."""
    log.exception("unexpected error on %s %s (request %s)", request.method, request.path, note.request_id)
    return ProxyError(500, "internal router error", type="server_error", code="internal_error").response()


def closed(state: AppContext, note: RequestNote, status: int) -> None:
    """The request is over: count it once (``prefix_router_requests_total``) and log it (``access_log``)."""
    state.metrics.request_done(note.worker, note.model, note.policy, status)
    if state.request_config.access_log:
        log_access(note, status, state.clock(), state.log_handler)


def admit(state: AppContext, request: EdgeRequest) -> None:
    """Shutdown, client key check and the global in-flight cap, before reading the body."""
    if state.deadlines.stopping:
        raise shutting_down(state.config.limits.retry_after_s)
    check_client(state.client_keys, request.headers)
    if state.pool.total_in_flight() >= state.request_config.max_in_flight:
        raise overloaded("the router is at its in-flight cap", state.config.limits.retry_after_s)


def read_body(state: AppContext, request: EdgeRequest) -> Awaitable[bytes]:
    """The body under the configured size limit and timeout: ``EdgeRequest.read_body``'s coroutine itself,
    no layer of its own."""
    config = state.request_config
    return request.read_body(config.max_body_bytes, config.client_body_s)


def policy_override(state: AppContext, request: EdgeRequest) -> str | None:
    name = request.headers.get(POLICY_HEADER)
    if name is None:
        return None
    if name not in state.policies:
        choices = ", ".join(sorted(state.policies))
        raise bad_request(f"unknown routing policy {name[:64]!r} (one of {choices})", param=POLICY_HEADER)
    return name


def routed(endpoint: Endpoint) -> NotedHandler:
    """The handler of a generation endpoint: the request admitted, its body read and keyed, then
    exchanged (one coroutine, no layer per endpoint)."""

    async def handler(request: EdgeRequest, note: RequestNote) -> web.StreamResponse:
        state = request.state
        admit(state, request)
        raw = await read_body(state, request)
        parsed = await parse_routed(state, endpoint, raw, request.headers)
        policy = policy_override(state, request)
        model = parsed.body.get("model")
        return await Exchange(
            state, request, raw, parsed, model if isinstance(model, str) else None, policy, note
        ).run()

    handler.__qualname__ = handler.__name__ = f"routed_{endpoint}"
    return handler


# the generation endpoints: their handlers (``proxy.run.lean`` calls them) and aiohttp's (``add_routes``)
ROUTED = {"/v1/chat/completions": routed("chat"), "/v1/completions": routed("completions")}
GUARDED = {path: guarded(handler) for path, handler in ROUTED.items()}
chat_completions = GUARDED["/v1/chat/completions"]
completions = GUARDED["/v1/completions"]


@guarded
async def passthrough(request: EdgeRequest, note: RequestNote) -> web.StreamResponse:
    """Any other ``/v1/*`` call, and the engines' token endpoints outside ``/v1`` (``ROOT_PASSTHROUGH``:
    vLLM's and SGLang's ``/tokenize``, ``/detokenize``), goes to the least loaded worker (serving the
    body's model, if named), chosen and counted by the routing core like any request."""
    state = request.state
    admit(state, request)
    raw = await read_body(state, request)
    model = parsing.body_model(raw, request.content_type())
    return await Exchange(state, request, raw, None, model, None, note).run()


@guarded
async def list_models(request: EdgeRequest, note: RequestNote) -> web.StreamResponse:
    state = request.state
    check_client(state.client_keys, request.headers)
    return json_response({"object": "list", "data": state.pool.models()})


async def health(request: web.Request) -> web.StreamResponse:
    return json_response({"status": "ok"})


async def ready(request: web.Request) -> web.StreamResponse:
    state = request.app[CONTEXT]
    if state.deadlines.stopping:
        return ProxyError(503, "shutting down", type="service_unavailable", code="shutting_down").response()
    up = sum(1 for w in state.pool if w.available)
    if up == 0:
        return ProxyError(503, "no healthy worker", type="service_unavailable", code="not_ready").response()
    return json_response({"status": "ready", "workers_available": up})


async def metrics(request: web.Request) -> web.StreamResponse:
    return web.Response(
        body=request.app[CONTEXT].metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


@guarded
async def post_only(request: EdgeRequest, note: RequestNote) -> web.StreamResponse:
    """The generation endpoints under another method: the router's own 405, not an engine's answer."""
    return http_errors.method_not_allowed(request.method, "POST")


@guarded
async def not_routed(request: EdgeRequest, note: RequestNote) -> web.StreamResponse:
    """Unknown paths (404) and methods (405), noted and logged like every request (aiohttp's routes: only
    aiohttp's server sends these here)."""
    assert isinstance(request, AiohttpRequest)
    return await http_errors.not_routed(request.request)


def add_routes(app: web.Application) -> None:
    """The OpenAI surface and the operational endpoints; ``add_catch_all`` goes after every other route."""
    for path, handler in (("/v1/chat/completions", chat_completions), ("/v1/completions", completions)):
        app.router.add_post(path, handler)
        app.router.add_route("*", path, post_only)
    app.router.add_get("/v1/models", list_models)
    app.router.add_route("*", "/v1/{tail:" + http_errors.ANY_PATH + "+}", passthrough)
    for path in ROOT_PASSTHROUGH:
        app.router.add_post(path, passthrough)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)


def add_catch_all(app: web.Application) -> None:
    http_errors.add_catch_all(app, not_routed)
