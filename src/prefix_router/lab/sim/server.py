"""``prefix-router engine-sim``: an OpenAI-compatible HTTP engine backed by the engine model (simulated).

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (SSE streaming or not),
``GET /v1/models``, ``GET /health``, ``POST /reset_prefix_cache``, ``GET /metrics`` (vLLM names), vLLM's
``POST /v1/chat/completions/render``, ``POST /v1/completions/render`` and ``POST /tokenize`` (prompt token
ids, for routers that route on them; see ``render_api``), plus ``/server_info`` and ``/model_info`` for
routers that probe them. Client disconnect aborts generation. ``role`` and ``kv_store`` make it one side of
prefill/decode disaggregation, in the three flows of ``pd_api`` (``kv_transfer_params``, shared storage,
SGLang's bootstrap). With ``kv_events`` its cache publishes KV
cache events over ZMQ while the app runs (``kv_publisher``: the token ids of the render endpoints, so a
router's precise mode keys requests and events alike).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from prefix_router.lab.sim.driver import EngineDriver, Ticket
from prefix_router.lab.sim.engine import EngineModel, RequestRejected
from prefix_router.lab.sim.kv_publisher import KvEventPublisher, KvEventsConfig
from prefix_router.lab.sim.kv_store import KvStore
from prefix_router.lab.sim.metrics import metrics_registry, render
from prefix_router.lab.sim.openai_api import ApiError, ApiRequest, EngineLimits, parse, response_id
from prefix_router.lab.sim.pd_api import (
    BOOTSTRAP_WAIT_S,
    Handoff,
    nixl_params,
    parse_handoff,
    prefill_only,
)
from prefix_router.lab.sim.profiles import DEFAULT_PROFILE, EngineProfile, get_profile
from prefix_router.lab.sim.render_api import render_chat, render_completions, tokenize
from prefix_router.lab.sim.streaming import complete, stream
from prefix_router.protocol import Endpoint
from prefix_router.routing import Role

READY_PREFIX = "ENGINE-SIM READY "
MAX_BODY_BYTES = 64 * 1024 * 1024
ROOM_POLL_S = 0.005  # how often a decode engine looks for its bootstrap room's prefill (wall time)


@dataclass(frozen=True, slots=True)
class EngineSimSettings:
    host: str = "127.0.0.1"
    port: int = 0
    model: str | None = None
    profile: str = DEFAULT_PROFILE
    kv_capacity_tokens: int | None = None
    time_scale: float = 1.0
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tick_s: float = 0.01
    kv_events: KvEventsConfig | None = None
    role: Role = "both"  # prefill/decode disaggregation: which side this engine plays
    kv_store: str | None = None  # the folder engines started together share (shared storage, SGLang rooms)

    def engine_profile(self) -> EngineProfile:
        base = get_profile(self.profile)
        return base.with_overrides(
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens
        )


@dataclass(slots=True)
class SimContext:
    """Everything the handlers share, owned by one app."""

    model: str
    profile: EngineProfile
    engine: EngineModel
    driver: EngineDriver
    limits: EngineLimits
    finished: Counter[str] = field(default_factory=Counter)  # requests by vLLM finished_reason
    kv_events: KvEventsConfig | None = None
    events: KvEventPublisher | None = None  # while the app runs, with kv_events
    role: Role = "both"
    store: KvStore | None = None
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))  # NIXL's remote_engine_id
    host: str = "127.0.0.1"


CONTEXT = web.AppKey("engine_sim_context", SimContext)


def build_context(cfg: EngineSimSettings) -> SimContext:
    profile = cfg.engine_profile()
    model = cfg.model or profile.model
    engine = EngineModel(
        profile, capacity_tokens=cfg.kv_capacity_tokens, max_span_s=cfg.tick_s / cfg.time_scale
    )
    limits = EngineLimits(model, engine.block_tokens, profile.max_model_len)
    driver = EngineDriver(engine, cfg.time_scale)
    store = KvStore(Path(cfg.kv_store)) if cfg.kv_store is not None else None
    return SimContext(
        model,
        profile,
        engine,
        driver,
        limits,
        kv_events=cfg.kv_events,
        role=cfg.role,
        store=store,
        host=cfg.host,
    )


def build_app(cfg: EngineSimSettings) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    ctx = build_context(cfg)
    app[CONTEXT] = ctx
    app.cleanup_ctx.append(_driver_lifecycle)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions/render", _render_chat)
    app.router.add_post("/v1/completions/render", _render_completions)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_post("/reset_prefix_cache", _reset)
    app.router.add_get("/metrics", _metrics_handler(ctx))
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, _server_info)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, _model_info)
    return app


async def _driver_lifecycle(app: web.Application) -> AsyncIterator[None]:
    """The engine's driver and its event publisher, closed however the start-up ends: a publisher left
    open (its replay port taken, say) would block for good whichever thread collects it (a zmq context
    collected with a socket still open waits for that socket in ``Context.__del__``)."""
    ctx = app[CONTEXT]
    try:
        if ctx.kv_events is not None:
            ctx.events = KvEventPublisher(ctx.kv_events, ctx.engine.block_tokens)
            ctx.engine.cache.listener = ctx.events.listener
            ctx.driver.on_step = ctx.events.flush
            ctx.events.start_replays()
        await ctx.driver.start()
        yield
    finally:
        await ctx.driver.stop()
        if ctx.events is not None:
            ctx.engine.cache.listener, ctx.driver.on_step = None, None
            await ctx.events.close()
            ctx.events = None


# ---------------------------------------------------------------------- generation


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completions")


async def _generate(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    request_id = uuid.uuid4().hex
    try:
        body = await _json_body(request)
        api = parse(endpoint, body, ctx.limits, request_id)
        handoff = parse_handoff(body)
        if ctx.role == "prefill" and handoff.room is not None:
            api = prefill_only(api)
        await _receive_kv(ctx, api, handoff)
        tickets = _submit(ctx, api)
    except ApiError as err:
        return web.json_response(err.body(), status=err.status)
    try:
        if api.stream:
            response = await stream(request, api, request_id, tickets)
            if all(t.done for t in tickets):
                _hand_off(ctx, api, handoff, request_id)
            return response
        return await complete(api, request_id, tickets, lambda: _hand_off(ctx, api, handoff, request_id))
    finally:
        for generation, ticket in zip(api.generations, tickets, strict=True):
            ctx.finished[generation.finish_reason if ticket.done else "abort"] += 1
            ctx.driver.cancel(ticket)


async def _receive_kv(ctx: SimContext, api: ApiRequest, handoff: Handoff) -> None:
    """A decode's side of a handoff: the prompt blocks its prefill computed, loaded after their transfer
    time (the blocks this engine did not hold), so that they count as cached tokens."""
    blocks = api.generations[0].request.blocks
    count = await _remote_blocks(ctx, handoff, blocks)
    if not count:
        return
    wanted = blocks[:count]
    moving = count - ctx.engine.cache.match(wanted)
    await asyncio.sleep(ctx.engine.transfer_time(moving * ctx.engine.block_tokens) * ctx.driver.time_scale)
    ctx.engine.load(wanted)


async def _remote_blocks(ctx: SimContext, handoff: Handoff, blocks: tuple[int, ...]) -> int:
    """How many leading prompt blocks a prefill engine holds for this request (0: none, prefill here)."""
    if handoff.remote_blocks is not None:
        return min(handoff.remote_blocks, len(blocks))
    if ctx.role != "decode" or ctx.store is None:
        return 0
    if handoff.room is None:
        return ctx.store.match(blocks)
    return min(await _wait_room(ctx, ctx.store, handoff.room), len(blocks))


async def _wait_room(ctx: SimContext, store: KvStore, room: int) -> int:
    deadline = asyncio.get_running_loop().time() + BOOTSTRAP_WAIT_S * ctx.driver.time_scale
    while (published := store.room(room)) is None:
        if asyncio.get_running_loop().time() > deadline:
            raise ApiError(f"KV transfer failed: no prefill for bootstrap_room {room}", "bootstrap_room", 500,
                           "InternalServerError")  # fmt: skip
        await asyncio.sleep(ROOM_POLL_S)
    return published


def _hand_off(ctx: SimContext, api: ApiRequest, handoff: Handoff, request_id: str) -> dict[str, Any]:
    """A prefill's side of a handoff, once its generation is done: its blocks saved for the decode
    engines (shared storage, SGLang's room), and the ``kv_transfer_params`` of its answer (NIXL-style)."""
    generation = api.generations[0]
    blocks = generation.request.blocks
    if ctx.role == "prefill" and ctx.store is not None:
        ctx.store.save(blocks)
        if handoff.room is not None:
            ctx.store.publish(handoff.room, len(blocks))
    if not handoff.remote_decode or generation.finish_reason != "length":
        return {}
    rid = response_id(api.endpoint, request_id)
    return {"kv_transfer_params": nixl_params(ctx.engine_id, rid, len(blocks), ctx.host)}


async def _render_chat(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    return await _answer(request, lambda body: render_chat(body, ctx.limits, uuid.uuid4().hex))


async def _render_completions(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    return await _answer(request, lambda body: render_completions(body, ctx.limits, uuid.uuid4().hex))


async def _tokenize(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    return await _answer(request, lambda body: tokenize(body, ctx.limits))


async def _answer(request: web.Request, build: Callable[[Any], Any]) -> web.Response:
    """A JSON answer built from the request body, or the OpenAI error ``build`` raised."""
    try:
        payload = build(await _json_body(request))
    except ApiError as err:
        return web.json_response(err.body(), status=err.status)
    return web.Response(body=orjson.dumps(payload), content_type="application/json")


async def _json_body(request: web.Request) -> Any:
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise ApiError(f"the request body is not valid JSON: {exc}") from exc


def _submit(ctx: SimContext, api: ApiRequest) -> list[Ticket]:
    changed = asyncio.Event()
    tickets: list[Ticket] = []
    if ctx.events is not None:
        for generation in api.generations:
            req = generation.request
            ctx.events.book.remember(req.extension or req.blocks, generation.full_ids(), api.cache_salt)
    try:
        for generation in api.generations:
            tickets.append(ctx.driver.submit(generation.request, changed))
    except RequestRejected as exc:
        for ticket in tickets:
            ctx.driver.cancel(ticket)
        raise ApiError(str(exc), "messages" if api.endpoint == "chat" else "prompt") from exc
    return tickets


# ---------------------------------------------------------------------- other endpoints


async def _models(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    card = {
        "id": ctx.model,
        "object": "model",
        "created": 0,
        "owned_by": "prefix-router-sim",
        "root": ctx.model,
        "max_model_len": ctx.profile.max_model_len,
    }
    return web.json_response({"object": "list", "data": [card]})


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _reset(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    ctx.engine.reset_prefix_cache()
    if ctx.events is not None:
        ctx.events.flush()
    return web.Response(status=200)


def _metrics_handler(ctx: SimContext) -> Callable[[web.Request], Any]:
    registry = metrics_registry(ctx.engine, ctx.model, ctx.driver.time_scale, ctx.finished)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=render(registry), content_type="text/plain", charset="utf-8")

    return handler


async def _server_info(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    info = {
        "served_model_name": ctx.model,
        "simulated": True,
        "profile": ctx.profile.name,
        "page_size": ctx.engine.block_tokens,
        "max_total_num_tokens": ctx.engine.capacity_tokens,
    }
    return web.json_response(info)


async def _model_info(request: web.Request) -> web.Response:
    return web.json_response({"served_model_name": request.app[CONTEXT].model, "is_generation": True})


# ---------------------------------------------------------------------- running


@contextlib.asynccontextmanager
async def running_server(cfg: EngineSimSettings) -> AsyncIterator[str]:
    """Serve one engine on the current loop; yields its base URL (``http://host:port``)."""
    runner = web.AppRunner(build_app(cfg), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, cfg.host, cfg.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def serve_forever(cfg: EngineSimSettings) -> None:
    """Serve until SIGINT/SIGTERM; prints one ready line with the URL on stdout."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running_server(cfg) as url:
        print(f"{READY_PREFIX}{url} (simulated engine, profile {cfg.profile})", flush=True)
        await stop.wait()
