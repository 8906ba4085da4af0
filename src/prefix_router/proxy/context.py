"""Everything one router app owns, built by ``create_app`` and stored on the application."""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from aiohttp import web

from prefix_router.pool import EventSubscriptions, PoolMonitor, WorkerPool, WorkerSettings
from prefix_router.proxy.config import Config
from prefix_router.proxy.edge.auth import KeySet
from prefix_router.proxy.edge.deadlines import Deadlines
from prefix_router.proxy.edge.render import Renders
from prefix_router.proxy.ops.logs import LineHandler
from prefix_router.proxy.ops.metrics import ProxyMetrics
from prefix_router.proxy.ops.record import TraceRecorder
from prefix_router.proxy.upstream.seam import Upstream
from prefix_router.routing import Router


@dataclass(frozen=True, slots=True)
class AdminChange:
    """A change of the pool made through the admin API (``worker``: the added worker's config)."""

    op: Literal["add", "remove", "drain", "undrain"]
    name: str
    worker: WorkerSettings | None = None


@dataclass(eq=False)
class AppContext:
    config: Config
    router: Router
    pool: WorkerPool
    monitor: PoolMonitor
    metrics: ProxyMetrics
    upstream: Upstream
    client_keys: KeySet
    admin_token: KeySet
    clock: Callable[[], float]
    policies: frozenset[str]
    recorder: TraceRecorder | None = None
    events: EventSubscriptions | None = None  # KV cache event subscriptions (workers with kv_events)
    renders: Renders | None = None  # precise keys rendered by an engine (no local template)
    log_handler: LineHandler | None = None  # the process's (``logs.configure``): access lines go there
    deadlines: Deadlines = field(default_factory=Deadlines)
    active: int = 0  # /v1/* requests being handled (the drain waits for them)
    # told of every admin change once it is made here (``serve --processes``: the other processes follow)
    on_admin: Callable[[AdminChange], None] | None = None
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _prefix: str = field(default_factory=lambda: f"pr-{random.getrandbits(32):08x}")
    # a random UUID4 but its last 12 hex digits, which count: unique per process and across replicas
    _uuid_prefix: str = field(default_factory=lambda: str(uuid.uuid4())[:24])

    def next_id(self) -> str:
        """An internal id (the routing core's request id)."""
        return f"{self._prefix}-{next(self._ids)}"

    def next_request_id(self) -> str:
        """A request id for ``x-request-id``: UUID-shaped, as some engines require (llama-cpp-python's
        server answers 400 to any other)."""
        return self._uuid_prefix + format(next(self._ids) & 0xFFFFFFFFFFFF, "012x")


CONTEXT = web.AppKey("prefix_router_context", AppContext)
