"""The HTTP edge: ``prefix-router serve``, an OpenAI-compatible reverse proxy over the routing core.

Subpackages by concern: ``edge`` (the request path: parse, route, forward, relay, account), ``upstream``
(the one-method seam to the engines and its llhttp client), ``ops`` (admin API, metrics, logs, reload,
records, the processes' shared pool) and ``run`` (the app, the server, the command, several processes);
``config``, ``settings`` and ``context`` are shared by all four. Other packages import only the names below;
the second half of them is what another edge over the same state reuses (``prefix_router.epp``: the app's
state and life, parsing, admission, accounting, the HTTP control routes, the flags and the reload).
"""

from __future__ import annotations

from prefix_router.node.config import Config, load_config, validate
from prefix_router.node.state import CONTEXT, AppContext
from prefix_router.node.request.access import RequestNote, request_id
from prefix_router.node.steps.accounting import CLIENT_GONE, Flight, settle
from prefix_router.node.request.auth import check_client, tenant_of, tenant_salt
from prefix_router.node.request.errors import ProxyError, bad_request, overloaded, shutting_down, unavailable
from prefix_router.proxy.edge.exchange import PASSTHROUGH_POLICY, passthrough_route, read_up_to
from prefix_router.node.request.forward import is_event_stream, safe_path, salted_body, takes_cache_salt
from prefix_router.proxy.edge.handlers import add_catch_all
from prefix_router.proxy.edge.handlers import closed as request_closed
from prefix_router.proxy.edge.handlers import health as health_route
from prefix_router.proxy.edge.handlers import metrics as metrics_route
from prefix_router.proxy.edge.handlers import ready as ready_route
from prefix_router.node.steps.keying import parse_routed
from prefix_router.node.request.parse import Parsed, body_model, session_id, too_large
from prefix_router.node.request.parse import parse as parse_request
from prefix_router.node.request.sse import ReplyAccumulator
from prefix_router.node.control.admin import add_routes as add_admin_routes
from prefix_router.node.telemetry.logs import configure as configure_logs
from prefix_router.node.telemetry.logs import flush as flush_logs
from prefix_router.node.control.reload import reload as reload_config
from prefix_router.node.life.build import build_app, create_app
from prefix_router.proxy.run.cli import add_config_flags, build_config, merged_config, print_config
from prefix_router.proxy.run.processes import parent_death_signal
from prefix_router.node.life.server import Reloader, Running, bind, loop_factory, start, tune_gc
from prefix_router.node.upstream.http_client import HttpUpstream
from prefix_router.node.upstream.seam import (
    FailureKind,
    Upstream,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
)

__all__ = [
    "CLIENT_GONE",
    "CONTEXT",
    "PASSTHROUGH_POLICY",
    "AppContext",
    "Config",
    "FailureKind",
    "Flight",
    "HttpUpstream",
    "Parsed",
    "ProxyError",
    "Reloader",
    "ReplyAccumulator",
    "RequestNote",
    "Running",
    "Upstream",
    "UpstreamError",
    "UpstreamRequest",
    "UpstreamResponse",
    "add_admin_routes",
    "add_catch_all",
    "add_config_flags",
    "bad_request",
    "bind",
    "body_model",
    "build_app",
    "build_config",
    "check_client",
    "configure_logs",
    "create_app",
    "flush_logs",
    "health_route",
    "is_event_stream",
    "load_config",
    "loop_factory",
    "merged_config",
    "metrics_route",
    "overloaded",
    "parent_death_signal",
    "parse_request",
    "parse_routed",
    "passthrough_route",
    "print_config",
    "read_up_to",
    "ready_route",
    "reload_config",
    "request_closed",
    "request_id",
    "safe_path",
    "salted_body",
    "session_id",
    "settle",
    "shutting_down",
    "start",
    "takes_cache_salt",
    "tenant_of",
    "tenant_salt",
    "too_large",
    "tune_gc",
    "unavailable",
    "validate",
]
