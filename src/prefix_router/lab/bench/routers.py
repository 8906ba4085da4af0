"""The router under test: prefix-router started in-process per policy, or any external router by URL."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from prefix_router.lab.sim.decision_log import DecisionLog
from prefix_router.node import Config, NodeState, public_names, validate
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
    workers: Sequence[str],
    policy: str,
    routing: Mapping[str, Any] | None = None,
    decisions: DecisionLog | None = None,
) -> AsyncIterator[str]:
    """prefix-router with a fresh state on a free loopback port of this process; yields its base URL.
    ``decisions``: its decision feed copied there while it runs (``follow``)."""
    from prefix_router.node import STATE
    from prefix_router.proxy import create_app, start

    app = create_app(router_config(workers, policy, routing))
    running = await start(app, "127.0.0.1", 0)
    if decisions is not None:
        decisions.copied = -1  # a new router: its feed counts from 0
    copier = None if decisions is None else asyncio.create_task(follow(app[STATE], decisions))
    try:
        yield running.url
    finally:
        if copier is not None:
            copier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await copier
        await running.stop()
        if decisions is not None:
            copy_closed(app[STATE], decisions, final=True)


FOLLOW_S = 0.25  # the feed holds 2048 decisions: copied well before a fast run wraps it


async def follow(state: NodeState, log: DecisionLog) -> None:
    """Copy the node's closed decisions to ``log`` in their order, as they close."""
    while True:
        await asyncio.sleep(FOLLOW_S)
        copy_closed(state, log)


def copy_closed(state: NodeState, log: DecisionLog, final: bool = False) -> None:
    """The decisions past the last copied one, up to the first still open (all of them when ``final``)."""
    feed = state.decisions
    names = public_names(state.pool, feed.hasher)
    for entry in feed.last(len(feed), after=log.copied):
        if entry.status is None and not final:
            return
        log.write(entry.view(names, feed.hasher, feed.origin))
        log.copied = entry.seq


def preload() -> None:
    """Import the proxy now, so that its import time does not fall into the first policy's run."""


@contextlib.asynccontextmanager
async def external(url: str) -> AsyncIterator[str]:
    """A router already running elsewhere (peers, or prefix-router started by hand)."""
    yield url.rstrip("/")
