"""Blocking network helpers of the launchers (and of the benchmarks and tests that start servers): a free
loopback port, a bounded ``GET`` and waiting until a URL answers 200.

Blocking on purpose: launchers run before any event loop (``engines llama-cpp``, ``demo``) or in worker
threads; async callers use ``asyncio.to_thread``.
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable

MAX_BODY_BYTES = 4 << 20


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def get_text(url: str, timeout_s: float = 5.0, max_bytes: int = MAX_BODY_BYTES) -> str | None:
    """The body of a 200 answer to ``GET url`` (at most ``max_bytes``); None for any other outcome."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            if response.status != 200:
                return None
            body: bytes = response.read(max_bytes)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return body.decode("utf-8", "replace")


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``GET url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _nothing() -> None:
    return None


def wait_until_ok(
    url: str,
    deadline: float,
    *,
    interval_s: float = 0.05,
    timeout_s: float = 2.0,
    check: Callable[[], None] = _nothing,
) -> bool:
    """Poll ``GET url`` until it answers 200 (True) or ``time.monotonic()`` passes ``deadline`` (False).

    ``check`` runs before every try and may raise to give up at once (a server process that exited).
    """
    while True:
        check()
        if answers(url, min(timeout_s, max(0.1, deadline - time.monotonic()))):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
