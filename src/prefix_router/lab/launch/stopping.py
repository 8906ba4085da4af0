"""How ``prefix-router engines`` stops: SIGTERM and SIGINT stop a fleet whether it is starting or up.

``interrupted_by_sigterm`` makes SIGTERM raise ``KeyboardInterrupt`` (as SIGINT does) for as long as the
fleet lives, so that a stop asked for while it starts, or between its ready lines and the wait, still stops
the instances already spawned. ``wait_for_stop`` then blocks until either signal arrives.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


@contextlib.contextmanager
def interrupted_by_sigterm() -> Iterator[None]:
    """SIGTERM raises ``KeyboardInterrupt`` inside the block; the previous handler is back after it."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_for_stop() -> None:
    """Block until SIGINT or SIGTERM (both end the ``with`` block, which stops the fleet)."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
