"""The Redis Streams operations of the shared state (thin wrappers over redis-py's asyncio client).

Each entry is ``{o: origin, d: payload}``: ``origin`` names the publishing replica (process), ``d`` is a
batch of changes (``codec``). Stream ids are ``<server ms>-<seq>``: their time part tells a receiver how
long ago, in Redis's clock, an entry was published.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError, WatchError

Entry = tuple[bytes, dict[bytes, bytes]]
START_ID = b"0-0"


def parse_id(entry_id: bytes | str) -> tuple[int, int]:
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = raw.partition("-")
    return int(ms), int(seq or 0)


def id_seconds(entry_id: bytes) -> float:
    return parse_id(entry_id)[0] / 1000.0


async def publish(
    client: aioredis.Redis, key: str, maxlen: int, origin: bytes, payloads: Sequence[bytes]
) -> list[bytes]:
    """XADD every payload in one pipelined round trip, trimming the stream to about ``maxlen``."""
    async with client.pipeline(transaction=False) as pipe:
        for payload in payloads:
            pipe.xadd(key, {b"o": origin, b"d": payload}, maxlen=maxlen, approximate=True)
        ids: list[bytes] = await pipe.execute()
    return ids


async def read_after(
    client: aioredis.Redis, key: str, last_id: bytes, count: int, block_ms: int | None
) -> list[Entry]:
    """Entries after ``last_id`` (waiting up to ``block_ms`` for one when given; None: no wait)."""
    reply: Any = await client.xread({key: last_id}, count=count, block=block_ms)
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3
        return list(next(iter(reply.values()))[0])
    return list(reply[0][1])


async def read_range(client: aioredis.Redis, key: str, last_id: bytes, count: int) -> list[Entry]:
    """Entries after ``last_id`` in id order, without blocking (warm-up from the backlog)."""
    low = b"-" if last_id == START_ID else b"(" + last_id
    entries: Any = await client.xrange(key, min=low, max=b"+", count=count)
    return list(entries or [])


async def bounds(client: aioredis.Redis, key: str) -> tuple[bytes | None, bytes] | None:
    """(first entry id or None, last generated id) of the stream; None when it does not exist."""
    try:
        info: dict[Any, Any] = await client.xinfo_stream(key)
    except ResponseError as exc:
        if "no such key" in str(exc).lower():
            return None
        raise
    first = info.get("first-entry") or info.get(b"first-entry")
    last = info.get("last-generated-id") or info.get(b"last-generated-id") or START_ID
    return (first[0] if first else None), _as_bytes(last)


async def server_time(client: aioredis.Redis) -> float:
    """Redis's clock, in seconds since the epoch."""
    seconds, micros = await client.time()
    return float(seconds) + float(micros) / 1e6


def _as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


async def drop_if_after(client: aioredis.Redis, key: str, limit_ms: int) -> bool:
    """Delete the stream if its last generated id is past ``limit_ms`` (checked and deleted atomically:
    a stream another replica replaced meanwhile is kept); returns whether it was deleted."""
    async with client.pipeline(transaction=True) as pipe:
        try:
            await pipe.watch(key)
            found = await bounds(pipe, key)
            if found is None or parse_id(found[1])[0] <= limit_ms:
                return False
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.delete(key)
            await pipe.execute()
        except WatchError:
            return False
    return True
