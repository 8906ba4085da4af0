"""The set of discovered worker URLs, and the listener that hears about each change."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class DiscoveryListener(Protocol):
    def on_add(self, url: str) -> None: ...

    def on_remove(self, url: str) -> None: ...


class Membership:
    """Turns full snapshots of worker URLs into add/remove calls. At most ``max_workers`` URLs are kept
    (beyond that, the first in sorted order win and the rest are counted in ``over_limit``)."""

    def __init__(self, listener: DiscoveryListener, max_workers: int) -> None:
        if max_workers <= 0:
            raise ValueError("max_workers must be positive")
        self.listener = listener
        self.max_workers = max_workers
        self.urls: set[str] = set()
        self.over_limit = 0
        self.updates = 0

    def replace(self, urls: Iterable[str]) -> tuple[list[str], list[str]]:
        """Make ``urls`` the current set; returns (added, removed), sorted."""
        wanted = sorted(set(urls))
        self.over_limit = max(0, len(wanted) - self.max_workers)
        target = set(wanted[: self.max_workers])
        removed, added = sorted(self.urls - target), sorted(target - self.urls)
        self.updates += 1
        for url in removed:
            self.urls.discard(url)
            self.listener.on_remove(url)
        for url in added:
            self.urls.add(url)
            self.listener.on_add(url)
        return added, removed
