"""DNS discovery: resolve a (headless Service) name on an interval; every address is a worker.

A failed lookup keeps the current workers (a DNS hiccup must not empty the pool); an answer with no
address removes them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable

from prefix_router.pool.worker_discovery.membership import Membership

log = logging.getLogger(__name__)
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (the system resolver, through the event loop)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def address_url(address: str, port: int, scheme: str = "http") -> str:
    """``http://10.0.0.1:8000``, ``http://[fd00::1]:8000``."""
    try:
        host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        host = address
    return f"{scheme}://{host}:{port}"


class DnsDiscovery:
    """Resolves ``host`` every ``interval_s`` and reports ``scheme://address:port`` for each address."""

    def __init__(
        self,
        host: str,
        port: int,
        membership: Membership,
        *,
        interval_s: float = 10.0,
        scheme: str = "http",
        timeout_s: float = 5.0,
        resolver: Resolver = system_resolver,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        self.host, self.port, self.scheme = host, port, scheme
        self.membership = membership
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.resolver = resolver
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> bool:
        """One lookup; True if it answered (and the membership was updated)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                addresses = await self.resolver(self.host, self.port)
        except (OSError, TimeoutError) as exc:
            self.failures += 1
            log.warning(
                "DNS discovery of %s failed (%s); keeping %d workers",
                self.host,
                exc,
                len(self.membership.urls),
            )
            return False
        self.membership.replace(address_url(a, self.port, self.scheme) for a in addresses)
        return True

    async def run(self) -> None:
        task = asyncio.current_task()
        while task is None or not task.cancelling():  # a cancellation may be swallowed by a lookup
            await self.refresh()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"dns-discovery-{self.host}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
