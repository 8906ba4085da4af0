"""The admin API under ``/admin``: bearer-token protected, off without a configured token. Every change
(add, remove, drain, undrain a worker) and every refused call is written to the audit log
(``node.telemetry.audit``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
import pydantic
from aiohttp import web

from prefix_router.node.control import dashboard
from prefix_router.node.control.routes import Handler, json_response
from prefix_router.node.request.auth import check_admin
from prefix_router.node.request.errors import ProxyError, bad_request
from prefix_router.node.request.parse import send_continue
from prefix_router.node.state import STATE, AdminChange, NodeState
from prefix_router.node.telemetry.audit import audit
from prefix_router.node.telemetry.decisions import FEED_SIZE, public_names
from prefix_router.pool import PoolError, WorkerSettings
from prefix_router.routing import ROLES
from prefix_router.settings import describe

MAX_ADMIN_BODY = 64 * 1024
DECISIONS_SHOWN = 50  # /admin/decisions without ?limit=


def admin_only(handler: Handler) -> Handler:
    return guard(handler, None)


def admin_change(action: str) -> Callable[[Handler], Handler]:
    """An admin call that changes the pool: audited with its outcome (the status it answered)."""
    return lambda handler: guard(handler, action)


def guard(handler: Handler, action: str | None) -> Handler:
    async def wrapper(request: web.Request) -> web.StreamResponse:
        try:
            check_admin(request.app[STATE].admin_token, request.headers)
        except ProxyError as err:
            if err.status == 401:
                audit("admin_refused", logging.WARNING, method=request.method, path=request.path,
                      remote=request.remote)  # fmt: skip
            return err.response()
        response = await answer(handler, request)
        if action is not None:
            worker = request.match_info.get("name") or request.get(ADDED_NAME)
            audit(action, worker=worker, url=request.get(ADDED_URL), status=response.status,
                  remote=request.remote)  # fmt: skip
        return response

    return wrapper


async def answer(handler: Handler, request: web.Request) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProxyError as err:
        return err.response()
    except PoolError as err:
        status = 404 if str(err).startswith("unknown") else 409
        return ProxyError(
            status, str(err), code="worker_conflict" if status == 409 else "not_found"
        ).response()


# what add_worker was asked to add, for its audit line
ADDED_NAME = web.RequestKey("prefix_router_added_name", str)
ADDED_URL = web.RequestKey("prefix_router_added_url", str)


@admin_only
async def list_workers(request: web.Request) -> web.StreamResponse:
    pool = request.app[STATE].pool
    return json_response({"workers": [pool.public(w) for w in pool]})


@admin_change("admin_add_worker")
async def add_worker(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = worker_config(await read_json(request))
    mode = state.config.routing.keys.mode
    if cfg.kv_events is not None and mode != "events":
        raise bad_request(
            f"kv_events: needs routing.keys.mode: events (mode is {mode})", code="invalid_worker"
        )
    request[ADDED_NAME], request[ADDED_URL] = cfg.resolved_name(), cfg.url
    worker = state.pool.add(cfg)
    told(state, AdminChange("add", worker.name, cfg))
    await state.monitor.refresh(worker)
    return json_response({"worker": state.pool.public(worker)}, status=201)


@admin_change("admin_remove_worker")
async def remove_worker(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    view = state.pool.public(state.pool.require(request.match_info["name"]))  # with what still runs there
    worker = state.pool.remove(request.match_info["name"])
    state.metrics.forget_worker(worker.name)
    told(state, AdminChange("remove", worker.name))
    return json_response({"removed": view})


@admin_change("admin_set_role")
async def patch_worker(request: web.Request) -> web.StreamResponse:
    """``PATCH /admin/workers/{name}`` with ``{"role": "prefill" | "decode" | "both"}``: the worker's role
    changed in place (docs/disaggregation.md), in every process of ``serve --processes``."""
    state = request.app[STATE]
    data = await read_json(request)
    if not isinstance(data, dict) or set(data) != {"role"}:
        raise bad_request(
            'a worker\'s role only: {"role": "prefill" | "decode" | "both"}', code="invalid_worker"
        )
    role = next((r for r in ROLES if r == data["role"]), None)
    if role is None:
        raise bad_request(f"role: one of {', '.join(ROLES)}", code="invalid_worker")
    worker = state.pool.set_role(request.match_info["name"], role)
    told(state, AdminChange("role", worker.name, role=role))
    return json_response({"worker": state.pool.public(worker)})


@admin_change("admin_drain_worker")
async def drain_worker(request: web.Request) -> web.StreamResponse:
    return set_draining(request.app[STATE], request.match_info["name"], True)


@admin_change("admin_undrain_worker")
async def undrain_worker(request: web.Request) -> web.StreamResponse:
    return set_draining(request.app[STATE], request.match_info["name"], False)


@admin_only
async def routing_summary(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    return json_response(
        {"policy": state.config.routing.policy, "summary": state.router.summary(state.clock())}
    )


@admin_only
async def decisions(request: web.Request) -> web.StreamResponse:
    """The last decisions (``?limit=``, at most ``FEED_SIZE``; ``?after=SEQ``: only newer ones), oldest
    first: worker, branch, predicted tokens and first-token time, each candidate's figures, the outcome."""
    state = request.app[STATE]
    limit = query_int(request, "limit", DECISIONS_SHOWN, 1, FEED_SIZE)
    after = query_int(request, "after", -1, -1, 2**62)
    names = public_names(state.pool, state.decisions.hasher)
    return json_response(
        {"total": state.decisions.total, "decisions": state.decisions.view(names, limit, after)}
    )


def query_int(request: web.Request, key: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"{key}: an integer", code="invalid_query") from None
    return min(max(value, low), high)


def set_draining(state: NodeState, name: str, draining: bool) -> web.Response:
    worker = state.pool.drain(name, draining)
    told(state, AdminChange("drain" if draining else "undrain", worker.name))
    return json_response({"worker": state.pool.public(worker)})


def told(state: NodeState, change: AdminChange) -> None:
    """Tell whoever follows this process's admin changes (the other processes of ``serve --processes``)."""
    if state.on_admin is not None:
        state.on_admin(change)


async def read_json(request: web.Request) -> Any:
    too_big = request.content_length is not None and request.content_length > MAX_ADMIN_BODY
    if not too_big:
        await send_continue(request)  # past the token check (``admin_only``) and the declared size
    raw = b"" if too_big else await request.read()
    if too_big or len(raw) > MAX_ADMIN_BODY:
        raise ProxyError(413, f"admin request body over {MAX_ADMIN_BODY} bytes", code="request_too_large")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"invalid JSON body: {exc}", code="invalid_json") from None


def worker_config(data: Any) -> WorkerSettings:
    try:
        return WorkerSettings.model_validate(data)
    except pydantic.ValidationError as exc:
        raise bad_request(describe(exc).removeprefix("invalid config: "), code="invalid_worker") from None


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/workers", list_workers)
    app.router.add_post("/admin/workers", add_worker)
    app.router.add_delete("/admin/workers/{name}", remove_worker)
    app.router.add_patch("/admin/workers/{name}", patch_worker)
    app.router.add_post("/admin/workers/{name}/drain", drain_worker)
    app.router.add_post("/admin/workers/{name}/undrain", undrain_worker)
    app.router.add_get("/admin/routing", routing_summary)
    app.router.add_get("/admin/decisions", decisions)
    dashboard.add_routes(app)  # behind the same token
