"""The HTTP edge: ``prefix-router serve``, an OpenAI-compatible reverse proxy over the routing core.

Subpackages by concern: ``edge`` (the request path: parse, route, forward, relay, account), ``upstream``
(the one-method seam to the engines and its llhttp client), ``ops`` (admin API, metrics, logs, reload,
records, the processes' shared pool) and ``run`` (the app, the server, the command, several processes);
``config``, ``settings`` and ``context`` are shared by all four. Other packages import only the names below.
"""

from __future__ import annotations

from prefix_router.proxy.config import Config, load_config, validate
from prefix_router.proxy.edge.exchange import read_up_to
from prefix_router.proxy.run.app import create_app
from prefix_router.proxy.run.server import loop_factory, start
from prefix_router.proxy.upstream.http_client import HttpUpstream
from prefix_router.proxy.upstream.seam import Upstream, UpstreamError, UpstreamRequest, UpstreamResponse

__all__ = [
    "Config",
    "HttpUpstream",
    "Upstream",
    "UpstreamError",
    "UpstreamRequest",
    "UpstreamResponse",
    "create_app",
    "load_config",
    "loop_factory",
    "read_up_to",
    "start",
    "validate",
]
