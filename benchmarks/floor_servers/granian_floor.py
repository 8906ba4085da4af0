"""Floor server for ``benchmarks/floor.py``: granian (a Rust HTTP server, RSGI interface) around an app
that reads the body, forwards it to one worker through the project's upstream client
(``proxy.http_client.HttpUpstream``, the ``Upstream`` seam) and relays the answer: a ``Content-Length``
answer whole, any other one as chunks as they arrive. No routing, no JSON, no logging, no metrics: a
measuring instrument, not product code.

granian is not a dependency of the project: it runs from its own venv under /tmp (as the peers do),
with this repository's ``src`` on ``PYTHONPATH`` and the upstream client's few dependencies beside it
(``benchmarks/floor.py --help`` has the install line). The worker's URL comes in ``FLOOR_UPSTREAM``:

    FLOOR_UPSTREAM=http://127.0.0.1:8000 PYTHONPATH=src /tmp/granian/bin/python -m granian \
        --interface rsgi --loop uvloop --http 1 --no-ws --working-dir benchmarks/floor_servers \
        --port 8001 granian_floor:app
"""

from __future__ import annotations

import os
from typing import Any

from prefix_router.proxy.http_client import HttpUpstream
from prefix_router.proxy.upstream import UpstreamError, UpstreamRequest, UpstreamResponse

BAD_GATEWAY = b'{"error":{"message":"upstream failed","type":"bad_gateway"}}'
BASE = os.environ.get("FLOOR_UPSTREAM", "http://127.0.0.1:8000").rstrip("/")
UPSTREAM = HttpUpstream(connect_timeout_s=5.0)  # touches no event loop until the first request


async def app(scope: Any, proto: Any) -> None:
    """The RSGI application (``scope``: granian's ``Scope``, ``proto``: its ``HTTPProtocol``)."""
    body = await proto()
    target = scope.path + ("?" + scope.query_string if scope.query_string else "")
    content_type = scope.headers.get("content-type", "application/json")
    request = UpstreamRequest(scope.method, BASE + target, {"Content-Type": content_type}, body)
    try:
        response = await UPSTREAM.send(request)
    except UpstreamError:
        proto.response_bytes(502, [("content-type", "application/json")], BAD_GATEWAY)
        return
    try:
        await relay(proto, response)
    except BaseException:
        response.abort()
        raise
    response.release()


async def relay(proto: Any, response: UpstreamResponse) -> None:
    headers = [("content-type", response.headers.get("Content-Type", "application/octet-stream"))]
    if "Content-Length" in response.headers:
        pieces = []
        while chunk := await response.next_chunk():
            pieces.append(chunk)
        proto.response_bytes(response.status, headers, b"".join(pieces))
        return
    transport = proto.response_stream(response.status, headers)
    while chunk := await response.next_chunk():
        await transport.send_bytes(chunk)
