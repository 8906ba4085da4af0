"""HTTP handlers of the OpenAI-compatible surface. Each one is: admit, parse, then an ``Exchange``; each is
``guarded``: it gets the request as an ``EdgeRequest`` and a ``RequestNote`` (request id, access log,
``prefix_router_requests_total``), and ``answer`` turns what it returns or raises into the answer."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from prefix_router.node import (
    ANY_PATH,
    CLIENT_GONE,
    ROOT_PASSTHROUGH,
    STATE,
    Handler,
    NodeState,
    ProxyError,
    RequestNote,
    add_control_routes,
    admit,
    body_model,
    check_client,
    check_encoding,
    json_response,
    method_not_allowed,
    parse_routed,
    policy_override,
    refuse_loops,
    request_closed,
    request_id,
    traced,
)
from prefix_router.protocol import REQUEST_ID_HEADER, Endpoint
from prefix_router.proxy.edge.exchange import Exchange, UpstreamReply
from prefix_router.proxy.edge.request import AiohttpRequest, EdgeRequest

log = logging.getLogger(__name__)
NotedHandler = Callable[[EdgeRequest, RequestNote], Awaitable[web.StreamResponse]]


def guarded(handler: NotedHandler) -> Handler:
    """aiohttp's handler of ``handler``: the request seen as an ``AiohttpRequest``, then ``answer``."""

    async def wrapper(request: web.Request) -> web.StreamResponse:
        return await answer(AiohttpRequest(request.app[STATE], request), handler)

    return wrapper


async def answer(request: EdgeRequest, handler: NotedHandler) -> web.StreamResponse:
    """Give the request its ``RequestNote``; turn errors into responses: a ``ProxyError`` into its OpenAI
    error (counted in ``prefix_router_rejected_total``), an ``UpstreamReply`` into its response, anything
    else into a logged 500; close the note with the status the client got (499 when it left), once."""
    state = request.state
    rid = request_id(request.headers) or state.next_request_id()
    note = RequestNote(rid, request.method, request.path, state.clock())
    traced(state, note, request.headers)
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
        request_closed(state, note, status)


def internal_error(request: EdgeRequest, note: RequestNote) -> web.Response:
    """A bug, not the client's fault: still an OpenAI-shaped answer (500), and logged with its traceback
    (call it inside the ``except``)."""
    log.exception("unexpected error on %s %s (request %s)", request.method, request.path, note.request_id)
    return ProxyError(500, "internal router error", type="server_error", code="internal_error").response()


def read_body(state: NodeState, request: EdgeRequest) -> Awaitable[bytes]:
    """The body under the configured size limit and timeout: ``EdgeRequest.read_body``'s coroutine itself,
    no layer of its own; 508 first for a request that came back round a loop (``refuse_loops``)."""
    refuse_loops(request.headers)
    config = state.request_config
    return request.read_body(config.max_body_bytes, config.client_body_s)


def routed(endpoint: Endpoint) -> NotedHandler:
    """The handler of a generation endpoint: the request admitted, its body read and keyed, then
    exchanged (one coroutine, no layer per endpoint)."""

    async def handler(request: EdgeRequest, note: RequestNote) -> web.StreamResponse:
        state = request.state
        admit(state, request.headers)
        check_encoding(request.headers)
        trace = note.trace
        if trace is not None:
            trace.stage("admitted")
        raw = await read_body(state, request)
        parsed = await parse_routed(state, endpoint, raw, request.headers)
        if trace is not None:
            trace.keyed(parsed.req.key_tokens, len(parsed.req.blocks))
        policy = policy_override(state, request.headers)
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
    admit(state, request.headers)
    raw = await read_body(state, request)
    model = body_model(raw, request.content_type())
    return await Exchange(state, request, raw, None, model, None, note).run()


@guarded
async def list_models(request: EdgeRequest, note: RequestNote) -> web.StreamResponse:
    state = request.state
    check_client(state.client_credentials, request.headers)
    return json_response({"object": "list", "data": state.pool.models()})


@guarded
async def post_only(request: EdgeRequest, note: RequestNote) -> web.StreamResponse:
    """The generation endpoints under another method: the router's own 405, not an engine's answer."""
    return method_not_allowed(request.method, "POST")


def add_routes(app: web.Application) -> None:
    """The OpenAI surface and the node's own routes (``/health``, ``/ready``, ``/metrics``); the node's
    catch-all (``add_catch_all``) goes after every other route."""
    for path, handler in (("/v1/chat/completions", chat_completions), ("/v1/completions", completions)):
        app.router.add_post(path, handler)
        app.router.add_route("*", path, post_only)
    app.router.add_get("/v1/models", list_models)
    app.router.add_route("*", "/v1/{tail:" + ANY_PATH + "+}", passthrough)
    for path in ROOT_PASSTHROUGH:
        app.router.add_post(path, passthrough)
    add_control_routes(app)
