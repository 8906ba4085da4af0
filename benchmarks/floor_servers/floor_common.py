"""What the floor servers share (``benchmarks/floor.py``): the exchange with the one worker, its command
lines. Beside the servers, so each imports it as a sibling (run as a script, or from granian's
``--working-dir``); ``floor.py`` and ``tests/lab/bench/test_floor_servers.py`` start the servers with
``floor_argv``, so the test runs exactly what the benchmark measures."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from prefix_router.proxy import Upstream, UpstreamError, UpstreamRequest, UpstreamResponse

T = TypeVar("T")
BAD_GATEWAY = b'{"error":{"message":"upstream failed","type":"bad_gateway"}}'
HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
FLOORS = ("aiohttp", "protocol", "granian")
MAX_BODY = sys.maxsize  # ``read_up_to``'s limit: a whole answer, however long (the worker's are bounded)


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


def floor_argv(
    floor: str, port: int, upstream: str, python: str = sys.executable
) -> tuple[list[str], dict[str, str] | None]:
    """The command line (and environment) of the ``floor`` server (one of ``FLOORS``) on ``port``,
    forwarding to ``upstream``; granian runs from ``python`` (the dev extra has it)."""
    if floor == "granian":
        argv = [
            python, "-m", "granian", "--interface", "rsgi", "--loop", "uvloop", "--http", "1",
            "--no-ws", "--workers", "1", "--backlog", "2048", "--log-level", "warning",
            "--working-dir", str(HERE), "--host", "127.0.0.1", "--port", str(port), "granian_floor:app",
        ]  # fmt: skip
        return argv, {"FLOOR_UPSTREAM": upstream, "PYTHONPATH": f"{SRC}:{HERE}"}
    if floor not in FLOORS:
        raise ValueError(f"unknown floor {floor}")
    script = HERE / f"{floor}_floor.py"
    return [sys.executable, str(script), "--port", str(port), "--upstream", upstream], None
