"""What a replica takes from a shared Redis: entries over a bound or implausible are refused and counted,
never applied; big batches are applied in slices; remote load that nobody refreshes stops weighing; a
stream deleted, reset or stamped past any publisher is recovered from."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from prefix_router.replication import RedisReplication
from prefix_router.replication.codec import encode_batch, encode_change
from prefix_router.replication.connect import make_client
from prefix_router.replication.load_share import STAMP
from prefix_router.replication.settings import ReplicationSettings
from prefix_router.replication.sync import ERRORS, SLICE_BLOCKS
from prefix_router.routing.router import ChangeKind, IndexChange

MAX_ID = b"18446744073709551615-18446744073709551615"


def insert(worker: str, blocks: tuple[int, ...], age: float = 0.0) -> bytes:
    return encode_change(IndexChange(ChangeKind.INSERT, worker, blocks), age)


def capacity(worker: str, blocks: int) -> bytes:
    return encode_change(IndexChange(ChangeKind.CAPACITY, worker, keep=blocks), 0.0)


async def post(state: RedisReplication, *parts: bytes, entry_id: bytes = b"*") -> None:
    await state.client.xadd(state.cfg.stream_key, {b"o": b"other/1", b"d": encode_batch(parts)}, id=entry_id)


async def marker(state: RedisReplication, kit: Any, tag: int) -> None:
    """Post a good entry after the ones under test and wait until it is applied: they were read."""
    await post(state, insert("w1", kit.prefix(tag)))
    await kit.wait_until(lambda: state.router.index.match(kit.prefix(tag)) == {"w1": 4})


async def test_an_entry_over_max_entry_bytes_is_refused_whole(replicas: Any, kit: Any) -> None:
    b = await replicas.add(cfg=kit.fast_config(max_entry_bytes=4096))
    await post(b, insert("w2", kit.prefix(1)), insert("w2", tuple(range(1, 600))))  # 4.8 kB
    await marker(b, kit, 9)
    assert b.counters.refused_entries == 1
    assert b.router.index.match(kit.prefix(1)) == {}  # its small change was not applied either


async def test_a_publisher_keeps_its_entries_under_max_entry_bytes(replicas: Any, kit: Any) -> None:
    cfg = kit.fast_config(max_entry_bytes=4096)
    a, b = await replicas.add(seed=1, cfg=cfg), await replicas.add(seed=2, cfg=cfg)
    blocks = tuple(range(10**6, 10**6 + 2000))  # 16 kB of blocks: one request's prompt
    worker = kit.dispatch(a.router, "long", blocks, 1.0)
    for tag in range(1, 40):  # and many small ones in the same batch
        kit.dispatch(a.router, f"s{tag}", kit.prefix(tag), 1.0)
    await kit.wait_until(lambda: b.router.index.blocks_of(worker) >= len(blocks))
    await kit.wait_until(lambda: all(b.router.index.match(kit.prefix(tag)) for tag in range(1, 40)))
    entries = await a.client.xrange(cfg.stream_key)
    assert len(entries) > 4 and max(len(fields[b"d"]) for _, fields in entries) <= 4096
    assert b.counters.refused_entries == 0 and all(b.router.index.holds(worker, x) for x in blocks)


async def test_an_entry_with_more_changes_than_batch_max_is_refused(replicas: Any, kit: Any) -> None:
    b = await replicas.add(cfg=kit.fast_config(batch_max=2))
    await post(b, *(insert("w2", kit.prefix(tag)) for tag in (1, 2, 3)))
    await marker(b, kit, 9)
    assert b.counters.refused_entries == 1 and b.router.index.match(kit.prefix(1)) == {}


async def test_a_forged_capacity_cannot_shrink_a_worker(replicas: Any, kit: Any) -> None:
    b = await replicas.add()
    index = b.router.index
    before = index.capacity_blocks("w1")
    await post(b, capacity("w1", 1))  # 16 tokens: far below the feedback's floor and one step
    await post(b, capacity("w1", before * 8 // 10))  # two steps at once
    await marker(b, kit, 9)
    assert b.counters.refused_entries == 2 and index.capacity_blocks("w1") == before
    one_step = before - before // 10  # what engine feedback on another replica may do
    await post(b, capacity("w1", one_step))
    await kit.wait_until(lambda: index.capacity_blocks("w1") == one_step)
    assert b.counters.refused_entries == 2


async def test_a_change_of_impossible_age_is_refused(replicas: Any, kit: Any) -> None:
    b = await replicas.add()
    for age in (float("nan"), float("inf"), -5.0):
        await post(b, insert("w2", kit.prefix(1), age))
    await marker(b, kit, 9)
    assert b.counters.refused_entries == 3 and b.router.index.match(kit.prefix(1)) == {}


async def test_big_batches_are_applied_in_slices(redis_server: Any, kit: Any) -> None:
    cfg = kit.fast_config()
    state = RedisReplication(kit.make_router(), *_clients(redis_server.url), "b", cfg)
    entries, per_entry = 8, 4000
    try:
        await state.start(run_tasks=False)
        for i in range(entries):
            blocks = tuple(range(1 + i * per_entry, 1 + (i + 1) * per_entry))
            await post(state, insert(kit.WORKERS[i % 4], blocks))
        seen: list[int] = []  # applied changes whenever the event loop ran another task

        async def watch() -> None:
            while True:
                seen.append(state.counters.applied_changes)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        try:
            assert await state.read_once() == entries
        finally:
            watcher.cancel()
        slices = entries * (per_entry + 1) // SLICE_BLOCKS
        assert len({n for n in seen if 0 < n < entries}) >= slices - 1 >= 2
    finally:
        await state.stop()


async def test_one_long_insert_is_applied_in_slices_and_leaves_the_same_blocks(
    redis_server: Any, kit: Any
) -> None:
    router = kit.make_router(index={"worker_capacity_tokens": 16 * 100_000})
    state = RedisReplication(router, *_clients(redis_server.url), "b", kit.fast_config())
    blocks = tuple(range(1, 3 * SLICE_BLOCKS + 100))
    try:
        await state.start(run_tasks=False)
        await post(state, insert("w1", blocks))
        seen: list[int] = []  # the worker's blocks whenever the event loop ran another task

        async def watch() -> None:
            while True:
                seen.append(router.index.blocks_of("w1"))
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        try:
            assert await state.read_once() == 1
        finally:
            watcher.cancel()
        assert len({n for n in seen if 0 < n < len(blocks)}) >= 3
        assert router.index.blocks_of("w1") == len(blocks)
        assert all(router.index.holds("w1", block) for block in blocks)
        assert router.index.match(blocks) == {"w1": len(blocks)}
    finally:
        await state.stop()


async def test_remote_load_nobody_refreshes_is_ignored(replicas: Any, kit: Any) -> None:
    cfg = kit.fast_config(load_interval_s=60, load_ttl_s=1.0)
    b = await replicas.add(cfg=cfg)
    client = b.client
    now_ms = int(await _server_time(client) * 1000)
    # a replica scored far in the future whose hash has no stamp and never expires
    await client.zadd(cfg.replicas_key, {"forged/1": now_ms + 10**9})
    await client.hset(cfg.load_key("forged/1"), mapping={"w1": 1000})
    # a replica scored now whose hash says it was refreshed long ago
    await client.zadd(cfg.replicas_key, {"old/1": now_ms})
    await client.hset(cfg.load_key("old/1"), mapping={STAMP: now_ms - 60_000, "w2": 1000})
    # and a live one
    await client.zadd(cfg.replicas_key, {"live/1": now_ms})
    await client.hset(cfg.load_key("live/1"), mapping={STAMP: now_ms, "w3": 2})
    await b.sync_load()
    assert [b.router.load.snapshot(w, 1.0).in_flight for w in kit.WORKERS] == [0, 0, 0, 2]
    assert b.counters.remote_replicas == 1


async def test_a_stream_stamped_with_the_maximum_id_is_dropped_and_replication_resumes(
    replicas: Any, kit: Any
) -> None:
    a, b = await replicas.add(seed=1), await replicas.add(seed=2)
    await post(a, insert("w1", kit.prefix(1)), entry_id=MAX_ID)  # no XADD can follow it
    await kit.wait_until(lambda: a.counters.stream_resets + b.counters.stream_resets >= 1)
    worker = kit.dispatch(a.router, "after", kit.prefix(5), 1.0)
    await kit.wait_until(lambda: b.router.index.match(kit.prefix(5)) == {worker: 4})
    assert b.router.index.match(kit.prefix(1)) == {}  # the entry stamped ahead was refused
    assert b.counters.refused_entries == 1


async def test_a_stream_deleted_behind_the_cursor_is_read_again_from_the_start(
    replicas: Any, kit: Any
) -> None:
    b = await replicas.add()
    await post(b, insert("w1", kit.prefix(1)), entry_id=b"9999999999999-0")  # stamped ahead, refused
    await kit.wait_until(lambda: b.counters.refused_entries == 1)
    await b.client.delete(b.cfg.stream_key)
    await post(b, insert("w2", kit.prefix(2)), entry_id=b"5-1")  # a new stream, behind the cursor
    await kit.wait_until(lambda: b.router.index.match(kit.prefix(2)) == {"w2": 4})
    assert b.counters.stream_resets >= 1


async def test_a_fresh_replica_counts_no_gap_in_a_trimmed_stream(redis_server: Any, kit: Any) -> None:
    cfg = kit.fast_config(stream_maxlen=10, batch_max=1)
    a = RedisReplication(kit.make_router(1), *_clients(redis_server.url), "a", cfg)
    late = RedisReplication(kit.make_router(2), *_clients(redis_server.url), "late", cfg)
    try:
        await a.start(run_tasks=False)
        for i in range(300):  # a second apart: not merged, one entry each
            kit.dispatch(a.router, str(i), (i + 1,), float(i))
        await a.flush()
        first = (await a.client.xrange(cfg.stream_key, count=1))[0][0]
        assert first != b"0-1"  # trimmed: a replica that had read the start would have missed entries
        await late.start(run_tasks=False)
        assert late.warmed and late.counters.gaps == 0
    finally:
        await a.stop()
        await late.stop()


async def test_warm_up_reads_the_whole_backlog_page_by_page(redis_server: Any, kit: Any) -> None:
    cfg = kit.fast_config(batch_max=1, read_count=4)
    a = RedisReplication(kit.make_router(1), *_clients(redis_server.url), "a", cfg)
    late = RedisReplication(kit.make_router(2), *_clients(redis_server.url), "late", cfg)
    try:
        await a.start(run_tasks=False)
        placed = {i: kit.dispatch(a.router, str(i), kit.prefix(i), float(i)) for i in range(1, 30)}
        await a.flush()
        assert a.counters.published_entries > 3 * cfg.read_count
        await late.start(run_tasks=False)
        assert late.counters.warmup_changes == a.counters.sent_changes
        for tag, worker in placed.items():
            assert late.router.index.match(kit.prefix(tag)) == {worker: 4}
    finally:
        await a.stop()
        await late.stop()


async def test_a_failed_read_is_followed_by_a_resync(redis_server: Any, kit: Any) -> None:
    cfg = kit.fast_config(stream_maxlen=10, batch_max=1, read_block_ms=0)
    a = RedisReplication(kit.make_router(1), *_clients(redis_server.url), "a", cfg)
    b = RedisReplication(kit.make_router(2), *_clients(redis_server.url), "b", cfg)
    try:
        await a.start(run_tasks=False)
        await b.start(run_tasks=False)
        kit.dispatch(a.router, "x", kit.prefix(1), 0.0)
        await a.flush()
        await b.read_step()
        assert b.last_id != b"0-0"
        redis_server.pause(True)
        try:
            with pytest.raises(ERRORS):
                await b.read_step()
        finally:
            redis_server.pause(False)
        for i in range(300):  # the entry b saw is trimmed meanwhile
            kit.dispatch(a.router, str(i), (i + 1,), float(i + 1))
        await a.flush()
        await b.read_step()  # resyncs first: the entries b missed are counted
        assert b.counters.gaps == 1
    finally:
        await a.stop()
        await b.stop()


async def test_time_spent_in_the_stream_is_counted(redis_server: Any, kit: Any) -> None:
    now = [100.0]
    b = RedisReplication(kit.make_router(), *_clients(redis_server.url), "b", kit.fast_config(),
                         clock=lambda: now[0])  # fmt: skip
    try:
        await b.start(run_tasks=False)
        published_ms = int(await _server_time(b.client) * 1000) - 30_000  # 30 s ago in Redis's clock
        await post(b, insert("w1", kit.prefix(1), age=5.0), entry_id=f"{published_ms}-1".encode())
        assert await b.read_once() == 1
        seen = b.router.index.last_access("w1", kit.prefix(1)[0])
        assert seen is not None and abs(seen - (100.0 - 5.0 - 30.0)) < 2.0
    finally:
        await b.stop()


async def _server_time(client: aioredis.Redis) -> float:
    seconds, micros = await client.time()
    return float(seconds) + micros / 1e6


def _clients(url: str) -> tuple[aioredis.Redis, aioredis.Redis]:
    cfg = ReplicationSettings(op_timeout_s=0.5)
    return make_client(url, cfg, 0.5, 2), make_client(url, cfg, 1.0, 1)
