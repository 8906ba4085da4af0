"""Several routers sharing their prefix view through a real redis-server."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from prefix_router.replication import RedisReplication
from prefix_router.replication.codec import encode_batch, encode_change
from prefix_router.routing.router import ChangeKind, IndexChange
from prefix_router.routing.types import Outcome


async def test_two_replicas_converge(replicas: Any, kit: Any) -> None:
    a, b = await replicas.add(seed=1), await replicas.add(seed=2)
    placed = {tag: kit.dispatch(a.router, f"a{tag}", kit.prefix(tag), 1.0) for tag in range(20)}
    placed |= {tag: kit.dispatch(b.router, f"b{tag}", kit.prefix(tag), 1.0) for tag in range(20, 40)}
    await kit.wait_until(lambda: all(s.router.index.match(kit.prefix(tag)) for tag in placed for s in (a, b)))
    for tag, worker in placed.items():
        for state in (a, b):
            assert state.router.index.match(kit.prefix(tag)) == {worker: 4}
    assert a.counters.own_entries >= 1 and a.stats()["failures"] == 0


async def test_a_shared_prefix_is_routed_to_the_worker_another_replica_chose(replicas: Any, kit: Any) -> None:
    a, b = await replicas.add(seed=1), await replicas.add(seed=2)
    chosen = {kit.dispatch(a.router, f"a{tag}", kit.prefix(tag), 1.0) for tag in range(8)}
    await kit.wait_until(lambda: all(b.router.index.match(kit.prefix(tag)) for tag in range(8)))
    for tag in range(8):
        decision = b.router.route(kit.request(f"b{tag}", kit.prefix(tag)), list(kit.WORKERS), 2.0)
        assert decision.branch == "prefix_hit" and decision.matched_blocks == 4
        assert decision.worker == a.router.index.match(kit.prefix(tag)).popitem()[0]
    assert len(chosen) > 1  # the prefixes were spread, so the test could fail


async def test_own_changes_are_not_applied_twice(replicas: Any, kit: Any) -> None:
    a = await replicas.add()
    await replicas.add()
    kit.dispatch(a.router, "x", kit.prefix(1), 1.0)
    await kit.wait_until(lambda: a.counters.own_entries >= 1)
    assert a.counters.applied_changes == 0


async def test_a_new_replica_warms_up_from_the_backlog_before_it_is_ready(replicas: Any, kit: Any) -> None:
    a = await replicas.add()
    placed = {tag: kit.dispatch(a.router, f"a{tag}", kit.prefix(tag), 1.0) for tag in range(50)}
    await a.flush()
    late = kit.make_router(seed=9)
    fresh = RedisReplication(late, *_clients(replicas.url), "late", kit.fast_config())
    replicas.states.append(fresh)
    assert not fresh.ready
    await fresh.start(run_tasks=False)
    assert fresh.ready and fresh.warmed and fresh.counters.warmup_changes == a.counters.sent_changes > 0
    for tag, worker in placed.items():
        assert late.index.match(kit.prefix(tag)) == {worker: 4}


async def test_trims_propagate(replicas: Any, kit: Any) -> None:
    a, b = await replicas.add(seed=1), await replicas.add(seed=2)
    req = kit.request("r", kit.prefix(3, 6))
    decision = a.router.route(req, list(kit.WORKERS), 1.0)
    a.router.dispatched(req, decision, 1.0)
    a.router.finished(req, decision.worker, Outcome(ok=False), 1.5)  # failed: nothing confirmed
    kept = kit.dispatch(a.router, "keep", kit.prefix(4), 2.0)
    await kit.wait_until(
        lambda: a.counters.sent_changes >= 2 and b.counters.applied_changes >= a.counters.sent_changes
    )
    assert b.router.index.match(kit.prefix(3, 6)) == {}
    assert b.router.index.match(kit.prefix(4)) == {kept: 4}


async def test_engine_feedback_moves_the_capacity_on_every_replica_and_forgets_no_prefix(
    redis_server: Any, kit: Any
) -> None:
    now = [0.0]
    a = RedisReplication(
        kit.make_router(1), *_clients(redis_server.url), "a", kit.fast_config(), clock=lambda: now[0]
    )
    b = RedisReplication(
        kit.make_router(2), *_clients(redis_server.url), "b", kit.fast_config(), clock=lambda: now[0]
    )
    try:
        await a.start(run_tasks=False)
        await b.start(run_tasks=False)
        for t, tag in ((2.0, 6), (3.0, 5)):
            now[0] = t
            kit.dispatch(a.router, f"r{tag}", kit.prefix(tag), t, candidates=["w1"])
        now[0] = 10.0
        req = kit.request("again", kit.prefix(5, 8))
        decision = a.router.route(req, ["w1"], 10.0)
        a.router.dispatched(req, decision, 10.0)
        a.router.finished(req, "w1", Outcome(cached_tokens=0), 10.0)  # the engine had evicted it
        await a.flush()
        # the inserts of 2.0 and 10.0 (prefix 5's touch at 3.0 was superseded, merged) and the capacity
        assert await b.read_once() == a.counters.sent_changes == 3
        capacity = 16 * 10_000 * 9 // 10  # one step (capacity_step 0.1) down
        assert a.router.index.capacity_tokens("w1") == b.router.index.capacity_tokens("w1") == capacity
        for router in (a.router, b.router):  # both prefixes are still there, on both replicas
            assert router.index.match(kit.prefix(6)) == {"w1": 4}
            assert router.index.match(kit.prefix(5, 8)) == {"w1": 8}
    finally:
        await a.stop()
        await b.stop()


async def test_times_are_rebuilt_in_the_receivers_clock(redis_server: Any, kit: Any) -> None:
    sender_now = [1000.0]
    receiver_now = [5.0]
    a = RedisReplication(kit.make_router(), *_clients(redis_server.url), "a", kit.fast_config(),
                   clock=lambda: sender_now[0])  # fmt: skip
    b = RedisReplication(kit.make_router(), *_clients(redis_server.url), "b", kit.fast_config(),
                   clock=lambda: receiver_now[0])  # fmt: skip
    try:
        await a.start(run_tasks=False)
        await b.start(run_tasks=False)
        worker = kit.dispatch(a.router, "x", kit.prefix(1), 990.0)  # 10 s before the sender's now
        await a.flush()
        assert await b.read_once() == 1
        seen = b.router.index.last_access(worker, kit.prefix(1)[0])
        assert seen is not None and abs(seen - (5.0 - 10.0)) < 0.5
    finally:
        await a.stop()
        await b.stop()


async def test_the_stream_is_bounded(redis_server: Any, kit: Any) -> None:
    cfg = kit.fast_config(stream_maxlen=100, batch_max=1, entries_per_flush=50)
    state = RedisReplication(kit.make_router(), *_clients(redis_server.url), "a", cfg)
    try:
        await state.start(run_tasks=False)
        for i in range(2000):  # a second apart: not merged
            kit.dispatch(state.router, str(i), (i + 1,), float(i))
        await state.flush()
        assert state.counters.published_entries >= 2000
        length = await state.client.xlen(cfg.stream_key)
        assert 100 <= length <= 100 + 100  # approximate trimming: whole macro nodes of 100 entries
    finally:
        await state.stop()


async def test_garbage_and_unknown_workers_are_counted_not_fatal(replicas: Any, kit: Any) -> None:
    b = await replicas.add()
    client = b.client
    await client.xadd(b.cfg.stream_key, {b"o": b"intruder/1", b"d": b"\x01\x05garbage"})
    unknown = encode_batch([encode_change(IndexChange(ChangeKind.INSERT, "nobody", (1, 2)), 0.0)])
    await client.xadd(b.cfg.stream_key, {b"o": b"other/1", b"d": unknown})
    good = encode_batch([encode_change(IndexChange(ChangeKind.INSERT, "w1", kit.prefix(7)), 0.0)])
    await client.xadd(b.cfg.stream_key, {b"o": b"other/1", b"d": good})
    await kit.wait_until(lambda: b.counters.applied_changes >= 1)
    assert b.counters.decode_errors == 1 and b.counters.unknown_worker_changes == 1
    assert b.counters.received_entries >= 3  # every entry read is counted, whatever became of it
    assert b.router.index.match(kit.prefix(7)) == {"w1": 4}


async def test_stop_publishes_what_is_left_and_unhooks(redis_server: Any, kit: Any) -> None:
    state = RedisReplication(kit.make_router(), *_clients(redis_server.url), "a", kit.fast_config())
    await state.start(run_tasks=False)
    kit.dispatch(state.router, "x", kit.prefix(1), 1.0)
    await state.stop()
    assert state.router.on_change is None and not state.ready
    assert state.counters.published_changes == 1
    check = aioredis.Redis.from_url(redis_server.url)
    try:
        assert await check.xlen(state.cfg.stream_key) == 1
    finally:
        await check.aclose()


def _clients(url: str) -> tuple[aioredis.Redis, aioredis.Redis]:
    from prefix_router.replication.connect import make_client
    from prefix_router.replication.settings import ReplicationSettings

    cfg = ReplicationSettings(op_timeout_s=0.5)
    return make_client(url, cfg, 0.5, 2), make_client(url, cfg, 2.0, 1)
