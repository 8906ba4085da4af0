"""Polling in tests: wait for a condition without sleeping a fixed, hopeful time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 15.0, step_s: float = 0.01) -> float:
    """Poll until ``predicate()``; returns the seconds it took (fails the test after ``timeout_s``: generous,
    since a passing test pays only its own wait and a loaded 2-core machine has taken over 5 s)."""
    began = time.monotonic()
    while not predicate():
        if time.monotonic() - began > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(step_s)
    return time.monotonic() - began
