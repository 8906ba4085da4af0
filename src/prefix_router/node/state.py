"""The node's state: everything one router process owns (``NodeState``), built by ``node.build_app`` and
stored on its application under ``STATE``."""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from aiohttp import web

from prefix_router.node.config import Config
from prefix_router.node.request.auth import Credentials, RevokedSessions
from prefix_router.node.request.deadlines import Deadlines
from prefix_router.node.request.render import Renders
from prefix_router.node.telemetry.decisions import DecisionFeed
from prefix_router.node.telemetry.logs import LineHandler
from prefix_router.node.telemetry.metrics import ProxyMetrics
from prefix_router.node.telemetry.record import TraceRecorder
from prefix_router.node.telemetry.tracing import Tracing
from prefix_router.node.upstream.seam import Upstream
from prefix_router.pool import EventSubscriptions, PoolMonitor, WorkerPool, WorkerSettings
from prefix_router.routing import Role, Router


@dataclass(frozen=True, slots=True)
class AdminChange:
    """A change of the pool made through the admin API (``worker``: the added worker's config; ``role``:
    a worker's new role)."""

    op: Literal["add", "remove", "drain", "undrain", "role"]
    name: str
    worker: WorkerSettings | None = None
    role: Role | None = None


class RequestConfig:
    """The configuration's values that every routed request reads, copied from one ``Config``
    (``NodeState.reconfigure`` makes a new one with each). In the compiled build a read of one is a load
    from this object; a read of a pydantic section's field is a dictionary lookup behind its
    ``__getattr__`` hook (about 250 instructions, some 30 a request). The sections are frozen, so the copy
    stays exact. Each name is its setting's last part."""

    __slots__ = (
        "access_log", "cache_salt", "client_body_s", "decision_headers", "first_byte_s",
        "forward_client_auth", "isolate_tenants", "max_attempts", "max_body_bytes", "max_generated_chars",
        "max_in_flight", "max_in_flight_per_worker", "max_response_buffer_bytes", "max_sse_line_bytes",
        "parse_in_thread_bytes", "policy", "render", "session_header", "stream_idle_s",
        "template_parse_in_thread_bytes", "total_s",
    )  # fmt: skip

    def __init__(self, config: Config) -> None:
        limits, timeouts, routing = config.limits, config.timeouts, config.routing
        self.max_in_flight = limits.max_in_flight
        self.max_in_flight_per_worker = limits.max_in_flight_per_worker
        self.max_body_bytes = limits.max_body_bytes
        self.parse_in_thread_bytes = limits.parse_in_thread_bytes
        self.template_parse_in_thread_bytes = limits.template_parse_in_thread_bytes
        self.max_response_buffer_bytes = limits.max_response_buffer_bytes
        self.max_generated_chars = limits.max_generated_chars
        self.max_sse_line_bytes = limits.max_sse_line_bytes
        self.client_body_s = timeouts.client_body_s
        self.total_s = timeouts.total_s
        self.first_byte_s = timeouts.first_byte_s
        self.stream_idle_s = timeouts.stream_idle_s
        self.max_attempts = config.retries.max_attempts
        self.policy = routing.policy
        self.isolate_tenants = routing.keys.isolate_tenants
        self.render = routing.events.render
        self.session_header = routing.sessions.header
        self.cache_salt = config.tenants.cache_salt
        self.decision_headers = config.tenants.decision_headers
        self.forward_client_auth = config.tenants.forward_client_auth
        self.access_log = config.access_log


@dataclass(eq=False)
class NodeState:
    """The node's configuration, routing core, worker pool and its monitor, metrics, upstream client,
    credentials and the counters every request shares, whatever carries it."""

    config: Config  # replaced only through ``reconfigure``
    router: Router
    pool: WorkerPool
    monitor: PoolMonitor
    metrics: ProxyMetrics
    upstream: Upstream
    client_credentials: Credentials
    admin_token: Credentials
    clock: Callable[[], float]
    policies: frozenset[str]
    recorder: TraceRecorder | None = None
    events: EventSubscriptions | None = None  # KV cache event subscriptions (workers with kv_events)
    renders: Renders | None = None  # precise keys rendered by an engine (no local template)
    log_handler: LineHandler | None = None  # the process's (``logs.configure``): access lines go there
    tracing: Tracing | None = None  # OpenTelemetry spans (``telemetry.tracing``): None, off (the default)
    deadlines: Deadlines = field(default_factory=Deadlines)
    decisions: DecisionFeed = field(default_factory=DecisionFeed)  # the last decisions (operators' view)
    revoked: RevokedSessions = field(default_factory=RevokedSessions)  # dashboard sessions signed out
    # the replication's counters and gauges (``replication.url``), for the dashboard; None: not replicated
    replication_stats: Callable[[], dict[str, float]] | None = None
    active: int = 0  # /v1/* requests being handled (the drain waits for them)
    # told of every admin change once it is made here (``serve --processes``: the other processes follow)
    on_admin: Callable[[AdminChange], None] | None = None
    # ``serve --processes``: what the other processes sent, read before each routing decision, and this
    # one's placement sent to them after each dispatch, before the request is forwarded (so that a repeat
    # sent after the answer finds it whichever process takes it)
    before_route: Callable[[], object] | None = None
    after_dispatch: Callable[[], None] | None = None
    processes: Callable[[], tuple[int, int]] | None = None  # ``serve --processes``: (running, configured)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _prefix: str = field(default_factory=lambda: f"pr-{random.getrandbits(32):08x}")
    # a random UUID4 but its last 12 hex digits, which count: unique per process and across replicas
    _uuid_prefix: str = field(default_factory=lambda: str(uuid.uuid4())[:24])
    request_config: RequestConfig = field(init=False)  # ``config``'s values that every request reads

    def __post_init__(self) -> None:
        self.request_config = RequestConfig(self.config)
        self.decisions.origin = self.clock()

    def reconfigure(self, config: Config) -> None:
        """Serve with ``config`` from now on (a reload)."""
        self.config = config
        self.request_config = RequestConfig(config)

    def next_id(self) -> str:
        """An internal id (the routing core's request id)."""
        return f"{self._prefix}-{next(self._ids)}"

    def next_request_id(self) -> str:
        """A request id for ``x-request-id``: UUID-shaped, as some engines require (llama-cpp-python's
        server answers 400 to any other)."""
        return self._uuid_prefix + format(next(self._ids) & 0xFFFFFFFFFFFF, "012x")


STATE = web.AppKey("prefix_router_state", NodeState)
