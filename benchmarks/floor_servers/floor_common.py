"""What the floor servers share (``benchmarks/floor.py``): the exchange with the one worker, its command
lines. Beside the servers, so each imports it as a sibling (run as a script, or from granian's
``--working-dir``); ``floor.py`` and ``tests/lab/bench/test_floor_servers.py`` start the servers with
``floor_argv``, so the test runs exactly what the benchmark measures. ``answer_as_router`` is the
exchange of the two floors that answer as prefix-router does (``aiohttp-direct``, ``protocol-request``).

Every floor takes ``--reuse-port``: several processes of it may listen on one port (``SO_REUSEPORT``), as
the processes of ``serve --processes N`` do (``floor.py --processes``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import random
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import uvloop
from aiohttp import web

from prefix_router.node import (
    STATE,
    Config,
    HttpUpstream,
    NodeState,
    Upstream,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
    build_app,
)
from prefix_router.proxy.edge import head
from prefix_router.proxy.edge.request import AiohttpRequest

T = TypeVar("T")
BAD_GATEWAY = b'{"error":{"message":"upstream failed","type":"bad_gateway"}}'
HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
FLOORS = ("aiohttp", "aiohttp-direct", "protocol", "protocol-request", "granian")


async def read_whole(response: UpstreamResponse) -> bytes:
    """The answer's body to its end, however long (the worker's answers are bounded)."""
    parts: list[bytes] = []
    while chunk := await response.next_chunk():
        parts.append(chunk)
    return b"".join(parts)


async def forward(
    upstream: Upstream,
    request: UpstreamRequest,
    relay: Callable[[UpstreamResponse], Awaitable[T]],
    failed: Callable[[], T],
) -> T:
    """Send ``request``; ``relay`` the answer (the exchange aborted if relaying fails or is cancelled,
    released after it), or answer ``failed()`` (the 502) when the worker fails."""
    try:
        response = await upstream.send(request)
    except UpstreamError:
        return failed()
    try:
        answer = await relay(response)
    except BaseException:
        response.abort()
        raise
    response.release()
    return answer


async def answer_as_router(
    upstream: Upstream, base: str, request: web.Request, body: bytes
) -> web.StreamResponse:
    """Forward ``request`` (its ``body`` read) and write the answer as prefix-router writes its own
    (``edge.head``, on the request as the router's edge sees it): a whole answer in one write, a stream as
    chunks as they come, aiohttp's response objects only where ``head`` leaves an answer to them (not
    HTTP/1.1, a status without a body)."""
    edge = AiohttpRequest(state(), request)
    content_type = request.headers.get("Content-Type", "application/json")
    sent = UpstreamRequest(request.method, base + request.path_qs, {"Content-Type": content_type}, body)
    return await forward(
        upstream,
        sent,
        lambda response: relayed(edge, response),
        lambda: whole(edge, 502, [], BAD_GATEWAY),
    )


@functools.cache
def state() -> NodeState:
    """A router's state, never used: what an edge request carries (``head`` reads only the request)."""
    config = Config.model_validate({"workers": [{"url": "http://127.0.0.1:9", "name": "w0"}]})
    return build_app(config, None, None, time.monotonic, random.Random(0))[STATE]


async def relayed(request: AiohttpRequest, response: UpstreamResponse) -> web.StreamResponse:
    headers = [("Content-Type", response.headers.get("Content-Type", "application/octet-stream"))]
    if "Content-Length" in response.headers:
        body = await read_whole(response)
        return whole(request, response.status, headers, body)
    relay = head.relay(request, response.status, headers)
    if relay is None:
        out = web.StreamResponse(status=response.status, headers=dict(headers))
        await request.respond(out)
        while chunk := await response.next_chunk():
            await out.write(chunk)
        await out.write_eof()
        return out
    while chunk := await response.next_chunk():
        await relay.write(chunk)
    await relay.write_eof()
    return relay.response()


def whole(
    request: AiohttpRequest, status: int, headers: list[tuple[str, str]], body: bytes
) -> web.StreamResponse:
    if not headers:
        headers = [("Content-Type", "application/json")]
    written = head.sent(request, status, headers, body)
    return written if written is not None else web.Response(status=status, body=body, headers=dict(headers))


def arguments(doc: str) -> argparse.Namespace:
    """A floor's command line (``floor_argv``'s): ``port``, ``upstream`` (no trailing slash) and
    ``reuse_port``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the one worker, e.g. http://127.0.0.1:8000")
    parser.add_argument("--reuse-port", action="store_true", help="share the port with other processes")
    args = parser.parse_args()
    args.upstream = args.upstream.rstrip("/")
    return args


def run(doc: str, serve: Callable[[int, str, bool], Coroutine[Any, Any, None]]) -> None:
    """A floor's ``main``: ``serve(port, upstream, reuse_port)`` on uvloop until the process is stopped."""
    args = arguments(doc)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.port, args.upstream, args.reuse_port))


def run_protocol(doc: str, make: Callable[[HttpUpstream, str], asyncio.Protocol]) -> None:
    """A protocol floor's ``main``: every connection served by ``make(upstream client, upstream URL)``."""
    run(doc, lambda port, base, reuse_port: serve_protocol(make, port, base, reuse_port))


async def serve_protocol(
    make: Callable[[HttpUpstream, str], asyncio.Protocol], port: int, base: str, reuse_port: bool
) -> None:
    upstream = HttpUpstream(connect_timeout_s=5.0)
    server = await asyncio.get_running_loop().create_server(
        lambda: make(upstream, base), "127.0.0.1", port, backlog=2048, reuse_port=reuse_port
    )
    try:
        await server.serve_forever()
    finally:
        await upstream.close()


def floor_argv(
    floor: str, port: int, upstream: str, python: str = sys.executable, processes: int = 1
) -> tuple[list[str], dict[str, str] | None]:
    """The command line (and environment) of the ``floor`` server (one of ``FLOORS``) on ``port``,
    forwarding to ``upstream``; granian runs from ``python`` (the dev extra has it). ``processes`` > 1:
    granian with that many workers; any other floor listening with ``--reuse-port``, to be started
    ``copies(floor, processes)`` times."""
    if floor == "granian":
        argv = [
            python, "-m", "granian", "--interface", "rsgi", "--loop", "uvloop", "--http", "1",
            "--no-ws", "--workers", str(processes), "--backlog", "2048", "--log-level", "warning",
            "--working-dir", str(HERE), "--host", "127.0.0.1", "--port", str(port), "granian_floor:app",
        ]  # fmt: skip
        return argv, {"FLOOR_UPSTREAM": upstream, "PYTHONPATH": f"{SRC}:{HERE}"}
    if floor not in FLOORS:
        raise ValueError(f"unknown floor {floor}")
    script = HERE / f"{floor.replace('-', '_')}_floor.py"
    argv = [sys.executable, str(script), "--port", str(port), "--upstream", upstream]
    return [*argv, "--reuse-port"] if processes > 1 else argv, None


def copies(floor: str, processes: int) -> int:
    """How many times ``floor_argv(floor, ..., processes=processes)`` is started: granian makes its own
    workers."""
    return 1 if floor == "granian" else processes
