"""``attach``: build the Redis clients from a URL and share a router's state through them."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from prefix_router.replication.settings import ReplicationSettings
from prefix_router.replication.sync import Clock, RedisReplication
from prefix_router.routing import Router


def default_replica_id() -> str:
    """The pod name under Kubernetes (``HOSTNAME``), else the host name."""
    return os.environ.get("HOSTNAME") or socket.gethostname() or "replica"


def make_client(
    url: str, cfg: ReplicationSettings, socket_timeout_s: float, connections: int
) -> aioredis.Redis:
    """A client without redis-py's own retries: the state's tasks back off and retry themselves. It
    authenticates with ``cfg.password`` when set (else with the URL's, if any); ``rediss://`` is TLS."""
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": cfg.connect_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "max_connections": connections,
    }
    if cfg.password is not None:
        options["password"] = cfg.password.get_secret_value()
    client: aioredis.Redis = aioredis.Redis.from_url(url, **options)
    return client


async def attach(
    router: Router,
    url: str,
    replica_id: str | None = None,
    cfg: ReplicationSettings | None = None,
    *,
    clock: Clock = time.monotonic,
    wall: Clock = time.time,
    start: bool = True,
) -> RedisReplication:
    """Share ``router``'s prefix index through the Redis at ``url`` (``redis://HOST:PORT/DB``).

    ``clock`` must be the clock whose readings the caller passes to the router as ``now``. With
    ``start`` (the default) this returns once the backlog is applied (or ``warmup_timeout_s`` passed).
    """
    cfg = cfg or ReplicationSettings()
    client = make_client(url, cfg, cfg.op_timeout_s, connections=4)
    reader = make_client(url, cfg, cfg.op_timeout_s + cfg.read_block_ms / 1000, connections=2)
    name = replica_id or default_replica_id()
    state = RedisReplication(router, client, reader, name, cfg, clock=clock, wall=wall)
    if start:
        await state.start()
    return state
