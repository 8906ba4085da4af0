"""Blocking network helpers of the launchers (and of the benchmarks and tests that start servers): a free
loopback port (or several an instance can bind again after a restart), a bounded ``GET`` and waiting until
a URL answers 200.

Blocking on purpose: launchers run before any event loop (``engines llama-cpp``, ``demo``) or in worker
threads; async callers use ``asyncio.to_thread``.
"""

from __future__ import annotations

import random
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

MAX_BODY_BYTES = 4 << 20
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
RESTARTABLE_SPAN = 8192  # restartable ports are drawn from this many ports below the ephemeral range


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def restartable_ports(
    host: str, count: int, rng: random.Random | None = None, ranges: Path = EPHEMERAL_RANGE
) -> list[int]:
    """``count`` distinct ports nobody listens on right now, drawn at random below the kernel's ephemeral
    range (``ip_local_port_range``), where no ``bind(0)`` and no outgoing connection lands: an instance
    restarted on its ports finds them free, though other processes picked free ports while it was down
    (seen: a parallel test's server took a killed vLLM's replay port before the new process bound it).
    Ports a launcher chooses at random from the same span may still meet: each is checked as it is drawn.
    Falls back to ``free_port`` where the ephemeral range leaves no room below it."""
    low = _ephemeral_low(ranges)
    start = max(1024, low - RESTARTABLE_SPAN)
    chosen: list[int] = []
    if count and low - start >= 4 * count:
        for port in (rng or random.Random()).sample(range(start, low), low - start):
            if len(chosen) == count:
                break
            if _bindable(host, port):
                chosen.append(port)
    while len(chosen) < count:
        port = free_port(host)
        if port not in chosen:
            chosen.append(port)
    return chosen


def _ephemeral_low(ranges: Path) -> int:
    try:
        return int(ranges.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


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
