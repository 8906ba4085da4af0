"""Sharing in-flight counts between replicas: one Redis hash per replica (``worker -> in flight``, and
``STAMP``: Redis's time of the refresh, in ms) that expires unless refreshed, and a sorted set of live
replicas scored by their last refresh (Redis time).

A reader trusts neither the key's TTL nor the set's scores: a hash whose stamp is missing, older than
``load_ttl_s`` or ahead of Redis's clock by as much, is ignored, and a member scored in the future is
never read, so counts that nobody refreshes stop weighing within ``load_ttl_s``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import redis.asyncio as aioredis

from prefix_router.replication.settings import ReplicationSettings

STAMP = b"\x00at"  # the hash's refresh time (no worker is named so: names are printable)


async def exchange(
    client: aioredis.Redis,
    cfg: ReplicationSettings,
    origin: str,
    local: Mapping[str, int],
    server_now: float,
) -> list[dict[bytes, bytes]]:
    """Publish this replica's counts; return the fresh hashes of the other live replicas (at most
    ``cfg.max_replicas``), without their stamps."""
    now_ms = int(server_now * 1000)
    members = await _publish(client, cfg, origin, local, now_ms)
    others = [m for m in members if m != origin.encode()]
    if not others:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for member in others:
            pipe.hgetall(cfg.load_key(member.decode("utf-8", "replace")))
        hashes: list[dict[bytes, bytes]] = await pipe.execute()
    return fresh(hashes, now_ms, int(cfg.load_ttl_s * 1000))


def fresh(hashes: Sequence[dict[bytes, bytes]], now_ms: int, ttl_ms: int) -> list[dict[bytes, bytes]]:
    """The hashes stamped within ``ttl_ms`` of ``now_ms`` (either way), stamps left out."""
    out = []
    for table in hashes:
        stamp = table.pop(STAMP, b"")
        if stamp.isdigit() and abs(int(stamp) - now_ms) <= ttl_ms:
            out.append(table)
    return out


async def _publish(
    client: aioredis.Redis, cfg: ReplicationSettings, origin: str, local: Mapping[str, int], now_ms: int
) -> list[bytes]:
    key, ttl_ms = cfg.load_key(origin), int(cfg.load_ttl_s * 1000)
    async with client.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        pipe.hset(key, mapping={STAMP: now_ms, **{name.encode(): count for name, count in local.items()}})
        pipe.pexpire(key, ttl_ms)
        pipe.zadd(cfg.replicas_key, {origin: now_ms})
        pipe.zremrangebyscore(cfg.replicas_key, "-inf", now_ms - ttl_ms)
        pipe.pexpire(cfg.replicas_key, 4 * ttl_ms)
        pipe.zremrangebyscore(cfg.replicas_key, f"({now_ms + ttl_ms}", "+inf")
        pipe.zrevrangebyscore(
            cfg.replicas_key, now_ms + ttl_ms, now_ms - ttl_ms, start=0, num=cfg.max_replicas
        )
        replies = await pipe.execute()
    members: list[bytes] = replies[-1]
    return members


def totals(hashes: list[dict[bytes, bytes]], workers: Collection[str]) -> dict[str, int]:
    """Sum of the other replicas' counts for each of ``workers`` (others and bad values ignored)."""
    out = dict.fromkeys(workers, 0)
    for table in hashes:
        for raw_name, raw_count in table.items():
            name = raw_name.decode("utf-8", "replace")
            if name in out and raw_count.isdigit():
                out[name] += int(raw_count)
    return out
