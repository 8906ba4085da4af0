"""The router under test: prefix-router started in-process per policy, or any external router by URL."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from prefix_router.node import Config, validate
from prefix_router.settings import set_dotted


def router_config(workers: Sequence[str], policy: str, routing: Mapping[str, Any] | None = None) -> Config:
    """A loopback router config over ``workers`` with ``policy`` and extra routing knobs, keyed as under
    ``routing:`` (dotted: ``policies.prefix.load_factor``)."""
    data: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "workers": list(workers), "log_level": "warning"}
    for key, value in (routing or {}).items():
        set_dotted(data, f"routing.{key}", value)
    set_dotted(data, "routing.policy", policy)
    return validate(data)


@contextlib.asynccontextmanager
async def in_process(
    workers: Sequence[str], policy: str, routing: Mapping[str, Any] | None = None
) -> AsyncIterator[str]:
    """prefix-router with a fresh state on a free loopback port of this process; yields its base URL."""
    from prefix_router.proxy import create_app, start

    running = await start(create_app(router_config(workers, policy, routing)), "127.0.0.1", 0)
    try:
        yield running.url
    finally:
        await running.stop()


def preload() -> None:
    """Import the proxy now, so that its import time does not fall into the first policy's run."""


@contextlib.asynccontextmanager
async def external(url: str) -> AsyncIterator[str]:
    """A router already running elsewhere (peers, or prefix-router started by hand)."""
    yield url.rstrip("/")
