"""Floor server for ``benchmarks/floor.py``: granian (a Rust HTTP server, RSGI interface) around an app
that reads the body, forwards it to one worker through the project's upstream client
(``node.upstream.http_client.HttpUpstream``, the ``Upstream`` seam) and relays the answer: a
``Content-Length`` answer whole, any other one as chunks as they arrive. No routing, no JSON, no logging, no
metrics: a measuring instrument, not product code.

granian is pinned in the dev extra as a measuring instrument (never the router's server); the command
line is ``floor_common.floor_argv("granian", ...)``'s, the worker's URL in ``FLOOR_UPSTREAM``.
"""

from __future__ import annotations

import os
from typing import Any

from floor_common import BAD_GATEWAY, forward, read_whole

from prefix_router.node import HttpUpstream, UpstreamRequest, UpstreamResponse

BASE = os.environ.get("FLOOR_UPSTREAM", "http://127.0.0.1:8000").rstrip("/")
UPSTREAM = HttpUpstream(connect_timeout_s=5.0)  # touches no event loop until the first request


async def app(scope: Any, proto: Any) -> None:
    """The RSGI application (``scope``: granian's ``Scope``, ``proto``: its ``HTTPProtocol``)."""
    body = await proto()
    target = scope.path + ("?" + scope.query_string if scope.query_string else "")
    content_type = scope.headers.get("content-type", "application/json")
    request = UpstreamRequest(scope.method, BASE + target, {"Content-Type": content_type}, body)

    def bad_gateway() -> None:
        proto.response_bytes(502, [("content-type", "application/json")], BAD_GATEWAY)

    await forward(UPSTREAM, request, lambda response: relay(proto, response), bad_gateway)


async def relay(proto: Any, response: UpstreamResponse) -> None:
    headers = [("content-type", response.headers.get("Content-Type", "application/octet-stream"))]
    if "Content-Length" in response.headers:
        body = await read_whole(response)
        proto.response_bytes(response.status, headers, body)
        return
    transport = proto.response_stream(response.status, headers)
    while chunk := await response.next_chunk():
        await transport.send_bytes(chunk)
