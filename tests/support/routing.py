"""The routing core (``prefix_router.routing``) as the tests drive it, without a proxy: a seeded router
with named workers, requests of given blocks and distinct block chains."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import RouteRequest

BLOCK_TOKENS = 16


def new_router(
    settings: dict[str, Any], workers: Iterable[str] = ("a",), seed: int = 0, **tuning: Any
) -> Router:
    """A router on ``settings`` (``RoutingSettings`` as a dict) drawing from ``random.Random(seed)``, with
    ``workers`` added in order; ``tuning``: ``Router``'s keyword arguments (``feedback``, ``units``,
    ``precise``: its algorithms' constants)."""
    router = Router(RoutingSettings.model_validate(settings), random.Random(seed), **tuning)
    for name in workers:
        router.add_worker(name)
    return router


def route_request(
    rid: str, blocks: tuple[int, ...], tail: int = 5, hash_key: int | None = None, session: str | None = None
) -> RouteRequest:
    """A request whose key is ``blocks`` of ``BLOCK_TOKENS`` tokens, its prompt ``tail`` tokens longer;
    hashed by ``hash_key`` (by default its first block, 0 without blocks)."""
    if hash_key is None:
        hash_key = blocks[0] if blocks else 0
    prompt = BLOCK_TOKENS * len(blocks) + tail
    return RouteRequest(rid, blocks, BLOCK_TOKENS, prompt, hash_key=hash_key, session=session)


def prefix(tag: int, length: int = 4) -> tuple[int, ...]:
    """``length`` block hashes of their own for each ``tag`` (below 1000 blocks)."""
    return tuple(tag * 1000 + i for i in range(length))
