"""The router process's life around the server (``server.serve`` calls these): the start-up summary line
and the graceful shutdown on SIGTERM.

Drain: the listener stays open. ``/ready`` answers 503 (the load balancer takes the replica out),
``/health`` answers 200 (the process is alive), new ``/v1/*`` requests get 503 ``shutting_down`` with
``Retry-After`` and ``Connection: close``; requests already running (streams included) go on up to
``timeouts.shutdown_s``, when what still runs is ended (a stream with an SSE error event). The process
exits as soon as nothing runs, at the latest a moment after the deadline.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

from aiohttp import web

from prefix_router.node.config import Config
from prefix_router.node.state import STATE, NodeState
from prefix_router.node.telemetry.logs import Fields

log = logging.getLogger("prefix_router")
AFTER_DEADLINE_S = 0.5  # for the handlers cut at the deadline to write their last event
POLL_S = 0.02
MAX_NAMES = 8  # worker names in the summary line (then "+N")


async def shutdown(app: web.Application) -> None:
    """Stop taking requests and wait for those running, up to ``timeouts.shutdown_s``."""
    state = app[STATE]
    loop = asyncio.get_running_loop()
    shutdown_s = state.config.timeouts.shutdown_s
    deadline = loop.time() + shutdown_s
    state.deadlines.stop(deadline)
    log.info(
        "shutting down: draining %d requests (up to %.1fs); /ready answers 503", state.active, shutdown_s
    )
    while state.active and loop.time() < deadline + AFTER_DEADLINE_S:
        await asyncio.sleep(POLL_S)
    if state.active:
        log.warning("shutting down: %d requests still running after the drain; closing them", state.active)


def summary(app: web.Application, addresses: list[str]) -> None:
    """One line saying what this router is: where it listens, workers, policy, auth, replication."""
    log.info(Fields(summary_fields(app[STATE], addresses)))


def summary_fields(state: NodeState, addresses: list[str]) -> dict[str, object]:
    config = state.config
    names = [w.name for w in state.pool]
    shown = ",".join(names[:MAX_NAMES]) + (f",+{len(names) - MAX_NAMES}" if len(names) > MAX_NAMES else "")
    return {
        "event": "serving",
        "listen": ",".join(addresses),
        "workers": len(names),
        "healthy": sum(1 for w in state.pool if w.health.healthy),
        "names": shown or None,
        "discovery": discovery_of(config),
        "policy": config.routing.policy,
        "auth": "on" if config.auth.api_keys else "off",
        "api_keys": len(config.auth.api_keys),
        "admin": "on" if config.auth.admin_token else "off",
        "replication": replication_of(config),
        "access_log": "on" if config.access_log else "off",
    }


def discovery_of(config: Config) -> str:
    settings = config.discovery
    return "off" if settings.kind is None else f"{settings.kind}:{settings.service}"


def replication_of(config: Config) -> str:
    """The backend without credentials: ``redis://host:port/db``."""
    url = config.replication.url
    if url is None:
        return "off"
    parts = urlsplit(url)
    where = parts.hostname or ""
    if parts.port is not None:
        where += f":{parts.port}"
    return f"{parts.scheme}://{where}{parts.path}"
