"""The router node: what a router process is, whatever carries its requests (``prefix_router.proxy``: the
OpenAI HTTP data plane; ``prefix_router.epp``: a gateway's ext_proc stream).

Subpackages, from the bottom: ``upstream`` (the one-method seam to the engines and its llhttp client),
``telemetry`` (logs, metrics, trace records, audit), ``request`` (a request's transport-free parts: errors,
client credentials, parsing and keying input, forwarded headers, the reply's reading, deadlines, the
access note, engine-rendered keys), then the state (``state``: ``NodeState``, built from ``config``),
``steps`` (what the node does with one request: admission, keying, the model check, the choice,
accounting), ``control`` (the control plane: ``/health``, ``/ready``, ``/metrics``, the admin API, reload,
the lifecycle, the pool shared by several processes) and ``life`` (the state built and run: probes,
monitor, discovery, replication, the listener, the command-line configuration). Other packages import
only the names below.
"""

from __future__ import annotations

from prefix_router.node.config import Config, load_config, validate
from prefix_router.node.control import dashboard
from prefix_router.node.control.admin import add_routes as add_admin_routes
from prefix_router.node.control.http_errors import (
    ANY_PATH,
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_URL_BYTES,
    method_not_allowed,
)
from prefix_router.node.control.lifecycle import shutdown as graceful_shutdown
from prefix_router.node.control.lifecycle import summary as log_summary
from prefix_router.node.control.reload import reload as reload_config
from prefix_router.node.control.routes import Handler, add_catch_all, json_response
from prefix_router.node.control.routes import add_routes as add_control_routes
from prefix_router.node.control.shared_pool import SharedPool
from prefix_router.node.life.build import build_app
from prefix_router.node.life.flags import add_config_flags, build_config, merged_config, print_config
from prefix_router.node.life.server import (
    FRONT,
    EarlyHangup,
    Hooks,
    ListenError,
    Reloader,
    Running,
    bind,
    loop_factory,
    start,
    tune_gc,
)
from prefix_router.node.life.server import run as run_app
from prefix_router.node.request.access import RequestNote, request_id
from prefix_router.node.request.auth import check_client, tenant_salt
from prefix_router.node.request.deadlines import Cause, Watch
from prefix_router.node.request.errors import (
    ProxyError,
    overloaded,
    shutting_down,
    unavailable,
    upstream_failed,
)
from prefix_router.node.request.forward import (
    HOP_BY_HOP,
    ROOT_PASSTHROUGH,
    downstream_headers,
    is_event_stream,
    redact,
    refuse_loops,
    safe_path,
    salt_value,
    salted_body,
    takes_cache_salt,
    upstream_headers,
    upstream_url,
    worker_secret,
)
from prefix_router.node.request.handoff import bootstrap_fields, edited, prefill_body, returned_params
from prefix_router.node.request.parse import Parsed, body_model, check_encoding, read_body, too_large
from prefix_router.node.request.sse import ReplyAccumulator
from prefix_router.node.state import STATE, NodeState
from prefix_router.node.steps.accounting import (
    CLIENT_GONE,
    Flight,
    cached_tokens,
    request_closed,
    settle,
    traced,
)
from prefix_router.node.steps.admission import admit, policy_override
from prefix_router.node.steps.choice import (
    PASSTHROUGH_POLICY,
    check_model,
    choose,
    nobody,
    note_choice,
    passthrough_req,
)
from prefix_router.node.steps.keying import parse_routed
from prefix_router.node.telemetry.decisions import DecisionEntry, DecisionFeed, Hasher, public_names
from prefix_router.node.telemetry.decisions import closed as closed_decision
from prefix_router.node.telemetry.logs import configure as configure_logs
from prefix_router.node.telemetry.logs import flush as flush_logs
from prefix_router.node.telemetry.tracing import TRACEPARENT, RequestTrace, Tracing, with_traceparent
from prefix_router.node.telemetry.tracing import from_env as tracing_from_env
from prefix_router.node.upstream.http_client import HttpUpstream
from prefix_router.node.upstream.seam import (
    FailureKind,
    Upstream,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
)

__all__ = [
    "ANY_PATH",
    "CLIENT_GONE",
    "FRONT",
    "HOP_BY_HOP",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_URL_BYTES",
    "PASSTHROUGH_POLICY",
    "ROOT_PASSTHROUGH",
    "STATE",
    "TRACEPARENT",
    "Cause",
    "Config",
    "DecisionEntry",
    "DecisionFeed",
    "EarlyHangup",
    "FailureKind",
    "Flight",
    "Handler",
    "Hasher",
    "Hooks",
    "HttpUpstream",
    "ListenError",
    "NodeState",
    "Parsed",
    "ProxyError",
    "Reloader",
    "ReplyAccumulator",
    "RequestNote",
    "RequestTrace",
    "Running",
    "SharedPool",
    "Tracing",
    "Upstream",
    "UpstreamError",
    "UpstreamRequest",
    "UpstreamResponse",
    "Watch",
    "add_admin_routes",
    "add_catch_all",
    "add_config_flags",
    "add_control_routes",
    "admit",
    "bind",
    "body_model",
    "bootstrap_fields",
    "build_app",
    "build_config",
    "cached_tokens",
    "check_client",
    "check_encoding",
    "check_model",
    "choose",
    "closed_decision",
    "configure_logs",
    "dashboard",
    "downstream_headers",
    "edited",
    "flush_logs",
    "graceful_shutdown",
    "is_event_stream",
    "json_response",
    "load_config",
    "log_summary",
    "loop_factory",
    "merged_config",
    "method_not_allowed",
    "nobody",
    "note_choice",
    "overloaded",
    "parse_routed",
    "passthrough_req",
    "policy_override",
    "prefill_body",
    "print_config",
    "public_names",
    "read_body",
    "redact",
    "refuse_loops",
    "reload_config",
    "request_closed",
    "request_id",
    "returned_params",
    "run_app",
    "safe_path",
    "salt_value",
    "salted_body",
    "settle",
    "shutting_down",
    "start",
    "takes_cache_salt",
    "tenant_salt",
    "too_large",
    "traced",
    "tracing_from_env",
    "tune_gc",
    "unavailable",
    "upstream_failed",
    "upstream_headers",
    "upstream_url",
    "validate",
    "with_traceparent",
    "worker_secret",
]
