"""Redis down, killed, restarted or frozen: routing goes on locally, failures are counted, replicas
catch up."""

from __future__ import annotations

import time
from typing import Any

from prefix_router.replication import RedisReplication, attach


async def test_redis_killed_and_restarted_mid_run(redis_server: Any, replicas: Any, kit: Any) -> None:
    a, b = await replicas.add(seed=1), await replicas.add(seed=2)
    before = {t: kit.dispatch(a.router, f"a{t}", kit.prefix(t), 1.0) for t in range(10)}
    await kit.wait_until(lambda: all(b.router.index.match(kit.prefix(t)) for t in before))

    redis_server.kill()
    started = time.perf_counter()
    during_a = {t: kit.dispatch(a.router, f"a{t}", kit.prefix(t), 2.0) for t in range(10, 30)}
    during_b = {t: kit.dispatch(b.router, f"b{t}", kit.prefix(t), 2.0) for t in range(30, 40)}
    routing_s = time.perf_counter() - started
    await kit.wait_until(lambda: not a.connected and not b.connected)
    await kit.wait_until(lambda: a.counters.publish_failures > 0 and b.counters.read_failures > 0)
    assert len(a.outbox) == 20  # kept for later, nothing lost yet

    redis_server.start()
    await kit.wait_until(lambda: all(b.router.index.match(kit.prefix(t)) for t in during_a), timeout_s=10)
    await kit.wait_until(lambda: all(a.router.index.match(kit.prefix(t)) for t in during_b), timeout_s=10)
    for t, worker in (during_a | during_b).items():
        assert a.router.index.match(kit.prefix(t)) == b.router.index.match(kit.prefix(t)) == {worker: 4}
    for t, worker in before.items():
        assert b.router.index.match(kit.prefix(t)) == {worker: 4}
    assert a.connected and b.connected and a.counters.reconnects >= 1 and b.counters.reconnects >= 1
    after = kit.dispatch(a.router, "after", kit.prefix(50), 3.0)
    await kit.wait_until(lambda: b.router.index.match(kit.prefix(50)) == {after: 4})
    print(f"30 routing decisions while Redis was down took {routing_s * 1e3:.2f} ms")


async def test_redis_down_at_start_then_up(redis_server: Any, kit: Any) -> None:
    redis_server.kill()
    cfg = kit.fast_config(outbox_capacity=100, warmup_timeout_s=0.5)
    state = await attach(kit.make_router(), redis_server.url, "lonely", cfg)
    try:
        assert state.ready and not state.warmed and not state.connected
        for i in range(1000):
            kit.dispatch(state.router, str(i), (i + 1, i + 2), 1.0)
        assert len(state.outbox) == 100 and state.outbox.dropped == 900
        assert state.stats()["outbox_dropped"] == 900 and state.stats()["failures"] >= 1
        redis_server.start()
        await kit.wait_until(lambda: state.counters.published_changes == 100)
        assert state.connected and len(state.outbox) == 0
    finally:
        await state.stop()


async def test_frozen_redis_times_out_and_recovers(redis_server: Any, replicas: Any, kit: Any) -> None:
    cfg = kit.fast_config(op_timeout_s=0.3)
    a, b = await replicas.add(seed=1, cfg=cfg), await replicas.add(seed=2, cfg=cfg)
    redis_server.pause(True)
    try:
        placed = {t: kit.dispatch(a.router, f"a{t}", kit.prefix(t), 1.0) for t in range(5)}
        await kit.wait_until(lambda: a.counters.publish_failures > 0 and not a.connected)
    finally:
        redis_server.pause(False)
    await kit.wait_until(lambda: all(b.router.index.match(kit.prefix(t)) for t in placed), timeout_s=10)
    assert {t: b.router.index.match(kit.prefix(t)) for t in placed} == {t: {w: 4} for t, w in placed.items()}


async def test_entries_trimmed_unseen_count_as_a_gap(redis_server: Any, kit: Any) -> None:
    cfg = kit.fast_config(stream_maxlen=10, batch_max=1, entries_per_flush=8)
    states: list[RedisReplication] = [
        await attach(kit.make_router(), redis_server.url, name, cfg, start=False) for name in ("a", "b")
    ]
    a, b = states
    try:
        for state in states:
            await state.start(run_tasks=False)
        kit.dispatch(a.router, "first", (1,), 1.0)
        await a.flush()
        await b.read_once()
        for i in range(500):
            kit.dispatch(a.router, str(i), (i + 10,), 1.0)
        await a.flush()
        await b.resync()
        assert b.counters.gaps == 1
    finally:
        for state in states:
            await state.stop()
