"""The KV event subscriber over real ZMQ sockets: both directions, replays of gaps, stale views without
a replay socket, restarts, rejected messages, a port in use, and the pool's membership."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from prefix_router.events import DROPPED_CONNECTION, AllBlocksCleared, BlockStored, EventBatch, encode_message
from prefix_router.pool.kv_events import EventSubscriptions
from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.settings import WorkerSettings
from prefix_router.routing.precise import PreciseTuning, Staleness, precise_chain, precise_seed
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from support.kv_events import FakePublisher, free_port
from support.waiting import wait_until

BS = 4
TOKENS = list(range(1, 13))


def keys() -> tuple[int, ...]:
    return precise_chain(TOKENS, BS, precise_seed("m", None, None))


def store(start: int, count: int, parent: int | None) -> BlockStored:
    hashes = tuple(100 + start + i for i in range(count))
    return BlockStored(hashes, parent, tuple(TOKENS[start * BS : (start + count) * BS]), BS)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.term()


def setup(bind: bool, endpoint: str, replay: str | None = None) -> tuple[Router, EventSubscriptions, Clock]:
    cfg = RoutingSettings.model_validate({"keys": {"mode": "events"}, "events": {"block_tokens": BS}})
    router = Router(cfg, precise=PreciseTuning(stale_hold_s=5))
    pool = WorkerPool(router, 8)
    events = {"endpoint": endpoint, "bind": bind, "topic": "kv", "model": "m", "replay_endpoint": replay}
    pool.add(WorkerSettings.model_validate({"url": "http://127.0.0.1:9", "name": "w", "kv_events": events}))
    clock = Clock()
    return router, EventSubscriptions(pool, router, clock), clock


@contextlib.asynccontextmanager
async def replaying_engine(
    ctx: zmq.asyncio.Context, *, synced: bool = True
) -> AsyncIterator[tuple[Router, EventSubscriptions, FakePublisher]]:
    """A router that binds the events endpoint, and a connecting publisher answering on a replay socket
    (vLLM's layout); ``synced``: the subscription is up before the publisher is made."""
    endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    router, subs, _ = setup(True, endpoint, replay)
    if synced:
        await subs.sync()
    pub = FakePublisher(ctx, endpoint, bind=False)
    pub.serve_replays(ctx, replay)
    try:
        yield router, subs, pub
    finally:
        await pub.close()
        await subs.close()


async def joined(pub: FakePublisher, subs: EventSubscriptions) -> None:
    """Empty batches until one is applied (ZMQ drops what a PUB sends before the peer joined): applied, not
    just decoded, so that the replay of the dropped ones it asked for is over (a test that counted replays
    from here saw that one land after it, under load)."""
    sub = subs.subscribers["w"]
    before = sub.stats.applied

    async def probe() -> bool:
        await pub.publish([])
        return sub.stats.applied > before

    for _ in range(500):
        if await probe():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the subscriber never received a message")


def engine_restarted(subs: EventSubscriptions) -> None:
    """What the engine itself shows of a restart: a probe of it failed (it was down a while)."""
    subs.pool.report(subs.pool.require("w"), False, "connection refused")


def confirmed(router: Router, now: float = 100.0) -> int:
    return router.precise.match(keys(), now).confirmed.get("w", 0)


@pytest.mark.parametrize("router_binds", [True, False])
async def test_events_reach_the_view_in_both_directions(ctx: zmq.asyncio.Context, router_binds: bool) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    if router_binds:
        router, subs, _ = setup(True, endpoint)
        await subs.sync()
        pub = FakePublisher(ctx, endpoint, bind=False)
    else:
        pub = FakePublisher(ctx, endpoint, bind=True)
        router, subs, _ = setup(False, endpoint)
        await subs.sync()
    try:
        await joined(pub, subs)
        await pub.publish([store(0, 2, None)])
        await pub.publish([store(2, 1, 101)])
        await wait_until(lambda: confirmed(router) == 3)
        assert router.precise.fresh("w", 100.0)
    finally:
        await pub.close()
        await subs.close()


async def test_a_gap_is_replayed_from_the_engines_router_socket(ctx: zmq.asyncio.Context) -> None:
    async with replaying_engine(ctx) as (router, subs, pub):
        await joined(pub, subs)
        replayed = subs.subscribers["w"].stats.replayed_batches  # the probes ZMQ dropped, if any
        await pub.publish([store(0, 1, None)], skip=True)  # lost on the way
        await pub.publish([store(1, 2, 100)])
        await wait_until(lambda: confirmed(router) == 3)
        stats = router.precise.stats("w")
        assert (stats.gaps, stats.replays, stats.orphan_blocks) == (1, 1, 0)
        assert subs.subscribers["w"].stats.replayed_batches == replayed + 1
        assert router.precise.fresh("w", 100.0)


async def test_a_first_batch_sent_before_the_subscription_arrived_is_replayed(
    ctx: zmq.asyncio.Context,
) -> None:
    """A connecting PUB (vLLM's, to an endpoint the router binds) drops what it sends before the router's
    subscription reaches it: the first message heard has a sequence above 0, and the batches before it
    come from the replay socket."""
    async with replaying_engine(ctx) as (router, subs, pub):
        await pub.publish([store(0, 1, None)], skip=True)  # the engine's first step, before the join
        await joined(pub, subs)  # empty batches until one arrives: ZMQ drops those sent before
        await pub.publish([store(1, 2, 100)])
        await wait_until(lambda: confirmed(router) == 3)
        stats, sub = router.precise.stats("w"), subs.subscribers["w"].stats
        assert (stats.orphan_blocks, stats.gaps, sub.replay_requests, sub.replay_failures) == (0, 0, 1, 0)
        assert sub.replayed_batches >= 1 and router.precise.fresh("w", 100.0)
        assert sub.applied == stats.messages  # live messages, each after the replay it asked for


RESTART_HEADROOM = 300


async def test_a_restarted_engines_first_batch_lost_on_the_way_is_replayed(ctx: zmq.asyncio.Context) -> None:
    endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    router, subs, _ = setup(True, endpoint, replay)
    await subs.sync()
    old = FakePublisher(ctx, endpoint, bind=False)
    try:
        await joined(old, subs)
        # The old process's sequence runs well ahead of what the new one sends while it joins (one empty
        # batch each 10 ms until one arrives): a restart is judged by a sequence not above the last.
        for _ in range(RESTART_HEADROOM):
            await old.publish([])
        await old.publish([store(0, 3, None)])
        await wait_until(lambda: confirmed(router) == 3)
    finally:
        await old.close()
    engine_restarted(subs)
    new = FakePublisher(ctx, endpoint, bind=False)  # its sequence starts at 0 again, its cache empty
    new.serve_replays(ctx, replay)
    try:
        await new.publish([store(0, 1, None)], skip=True)
        await joined(new, subs)
        await new.publish([store(1, 1, 100)])
        await wait_until(lambda: router.precise.stats("w").restarts == 1)
        await wait_until(lambda: confirmed(router) == 2)
        assert router.precise.stats("w").orphan_blocks == 0
    finally:
        await new.close()
        await subs.close()


async def test_a_router_started_after_its_engine_takes_what_the_engine_still_buffers(
    ctx: zmq.asyncio.Context,
) -> None:
    async with replaying_engine(ctx, synced=False) as (router, subs, pub):
        for _ in range(3):
            await pub.publish([], skip=True)  # no router yet
        await pub.publish([store(0, 2, None)], skip=True)
        del pub.sent[0], pub.sent[1]  # out of the engine's replay buffer (buffer_steps)
        await subs.sync()
        await joined(pub, subs)
        await wait_until(lambda: confirmed(router) == 2)
        sub = subs.subscribers["w"].stats
        assert (sub.replay_requests, sub.replay_failures) == (1, 0) and router.precise.fresh("w", 100.0)


async def test_a_gap_without_replay_leaves_the_view_stale_for_a_while(ctx: zmq.asyncio.Context) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router, subs, clock = setup(True, endpoint)
    await subs.sync()
    pub = FakePublisher(ctx, endpoint, bind=False)
    try:
        await joined(pub, subs)
        await pub.publish([store(0, 1, None)])
        await pub.publish([], skip=True)
        await pub.publish([store(1, 1, 100)])
        await wait_until(lambda: router.precise.stats("w").gaps == 1)
        assert router.precise.staleness("w", clock.now) == Staleness.GAP
        assert "w" not in router.precise.match(keys(), clock.now).fresh
        assert router.precise.fresh("w", clock.now + 6)  # stale_hold_s later
        assert confirmed(router, clock.now + 6) == 2  # the events after the gap were applied
    finally:
        await pub.close()
        await subs.close()


async def publisher(ctx: zmq.asyncio.Context, endpoint: str, bind: bool) -> FakePublisher:
    """A publisher on ``endpoint``; a bind retried while the previous process's port is still closing."""
    for _ in range(200):
        try:
            return FakePublisher(ctx, endpoint, bind=bind)
        except zmq.ZMQError:
            await asyncio.sleep(0.01)
    raise AssertionError(f"{endpoint} stayed in use")


@pytest.mark.parametrize(("router_binds", "ahead"), [(True, 0), (True, 50), (False, 50)])
async def test_a_restarted_engine_clears_the_view_at_its_first_message(
    ctx: zmq.asyncio.Context, router_binds: bool, ahead: int
) -> None:
    """A new process's sequence starts at 0 again; ``ahead``: it sent that many batches more than the old
    one before the router heard it (no sequence tells then: the dropped connection does)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router, subs, _ = setup(router_binds, endpoint)
    old = await publisher(ctx, endpoint, bind=not router_binds)
    await subs.sync()
    try:
        await joined(old, subs)
        await old.publish([store(0, 3, None)])
        await wait_until(lambda: confirmed(router) == 3)
    finally:
        await old.close()
    engine_restarted(subs)
    new = await publisher(ctx, endpoint, bind=not router_binds)
    new.seq = old.seq + ahead if ahead else 0
    try:
        await joined(new, subs)
        await new.publish([store(0, 1, None)])  # the old process's first block again: nothing after it
        await wait_until(lambda: confirmed(router) == 1)
        stats, sub = router.precise.stats("w"), subs.subscribers["w"].stats
        assert (stats.restarts, stats.gaps, sub.disconnects) == (1, 0, 1)
    finally:
        await new.close()
        await subs.close()


async def test_a_fanouts_drop_notice_makes_the_next_sequence_judged_as_a_reconnection(
    ctx: zmq.asyncio.Context,
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router, subs, _ = setup(True, endpoint)
    await subs.sync()
    pub = FakePublisher(ctx, endpoint, bind=False)  # stands for the fan-out's XPUB
    try:
        await joined(pub, subs)
        await pub.publish([store(0, 3, None)])
        await wait_until(lambda: confirmed(router) == 3)
        pub.seq += 5
        await pub.publish([])  # a gap on the same connection: not a restart
        await wait_until(lambda: router.precise.stats("w").gaps == 1)
        await pub.send_raw([b"kv", DROPPED_CONNECTION, b""])
        engine_restarted(subs)
        pub.seq += 5
        await pub.publish([store(0, 1, None)])
        await wait_until(lambda: router.precise.stats("w").restarts == 1)
        assert confirmed(router) == 1 and subs.subscribers["w"].stats.disconnects == 1
        assert router.precise.stats("w").gaps == 1
    finally:
        await pub.close()
        await subs.close()


async def test_garbage_is_rejected_and_the_subscription_goes_on(ctx: zmq.asyncio.Context) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router, subs, _ = setup(True, endpoint)
    await subs.sync()
    pub = FakePublisher(ctx, endpoint, bind=False)
    try:
        await joined(pub, subs)
        await pub.send_raw([b"kv", b"\x00" * 8, b"\xc1not msgpack"])
        await pub.send_raw([b"kv", b"short"])
        pub.tagged = False  # positional arrays (SGLang, older vLLM) on the same stream
        await pub.publish([store(0, 3, None)])
        await wait_until(lambda: confirmed(router) == 3)
        assert subs.subscribers["w"].stats.rejected == 2
    finally:
        await pub.close()
        await subs.close()


async def test_a_port_in_use_is_reported_not_fatal(ctx: zmq.asyncio.Context) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    squatter = ctx.socket(zmq.PULL)
    squatter.bind(endpoint)
    _router, subs, _ = setup(True, endpoint)
    try:
        await subs.sync()
        sub = subs.subscribers["w"]
        assert sub.stats.socket_error and not sub.running
    finally:
        squatter.close(0)
        await subs.close()


async def test_subscriptions_follow_the_pool() -> None:
    _router, subs, _ = setup(True, f"tcp://127.0.0.1:{free_port()}")
    await subs.sync()
    assert list(subs.subscribers) == ["w"] and subs.subscribers["w"].running
    subs.pool.remove("w")
    await subs.sync()
    assert subs.subscribers == {}
    await subs.close()


async def test_a_worker_with_a_configured_model_is_event_fed_before_its_first_message() -> None:
    router, subs, _ = setup(True, f"tcp://127.0.0.1:{free_port()}")
    await subs.sync()
    assert "w" in router.precise and router.precise.fresh("w", 100.0)  # an engine that has cached nothing
    await subs.close()


# ---------------------------------------------------------------- publishers that are not the engine


def admitted(subs: EventSubscriptions) -> None:
    """The worker's first probe passed: healthy, no failure seen."""
    subs.pool.report(subs.pool.require("w"), True)


async def test_a_second_publishers_seq_0_is_refused_and_the_engine_goes_on(ctx: zmq.asyncio.Context) -> None:
    async with replaying_engine(ctx) as (router, subs, engine):
        admitted(subs)
        await joined(engine, subs)
        await engine.publish([store(0, 3, None)])
        await wait_until(lambda: confirmed(router) == 3)
        forger = FakePublisher(ctx, subs.subscribers["w"].settings.endpoint, bind=False)
        try:
            sub = subs.subscribers["w"].stats
            for _ in range(500):  # until its connection carries one (ZMQ drops before it joined)
                forger.seq = 0
                await forger.publish([AllBlocksCleared()])
                if sub.refused:
                    break
                await asyncio.sleep(0.01)
            await wait_until(lambda: sub.refused >= 1)
        finally:
            await forger.close()
        stats = router.precise.stats("w")
        assert (stats.restarts, stats.clears, stats.refused_restarts) == (0, 0, sub.refused)
        assert confirmed(router, 200.0) == 3  # kept (stale for a while: the stream disagreed with itself)
        applied = sub.applied
        await engine.publish([store(2, 1, 101)])  # the engine's next sequence: no gap
        await wait_until(lambda: sub.applied == applied + 1)
        assert router.precise.stats("w").gaps == 0


async def test_a_sequence_past_the_engines_own_is_refused(ctx: zmq.asyncio.Context) -> None:
    """A forged message far ahead: the engine's replay socket ends its answer before that sequence, so the
    message is not applied and the engine's next message is the next."""
    async with replaying_engine(ctx) as (router, subs, engine):
        admitted(subs)
        await joined(engine, subs)
        await engine.publish([store(0, 1, None)])
        await wait_until(lambda: confirmed(router) == 1)
        sub = subs.subscribers["w"]
        seq = router.precise.summary("w", 0.0)["last_seq"]
        await sub.handle(encode_message(b"kv", seq + 1000, EventBatch(0.0, (store(1, 2, 100),))))
        assert sub.stats.refused == 1 and confirmed(router) == 1
        assert router.precise.summary("w", 0.0)["last_seq"] == seq
        await engine.publish([store(1, 1, 100)])
        await wait_until(lambda: confirmed(router) == 2)
        assert router.precise.fresh("w", 100.0) and router.precise.stats("w").replays == 0


async def test_a_block_size_the_engine_does_not_state_leaves_the_view_fresh(ctx: zmq.asyncio.Context) -> None:
    router, subs, _ = setup(True, f"tcp://127.0.0.1:{free_port()}")
    await subs.sync()
    sub = subs.subscribers["w"]
    try:
        await sub.handle(
            encode_message(b"kv", 0, EventBatch(0.0, (BlockStored((9,), None, tuple(range(16)), 16),)))
        )
        assert router.precise.staleness("w", 100.0) == Staleness.FRESH
        router.set_engine_block("w", 16)  # the engine's own metrics (cache_config_info) say 16
        await sub.handle(
            encode_message(b"kv", 1, EventBatch(0.0, (BlockStored((9,), None, tuple(range(16)), 16),)))
        )
        assert router.precise.staleness("w", 100.0) == Staleness.BLOCK_SIZE
        assert router.precise.stats("w").block_size_mismatches == 2
    finally:
        await subs.close()


# ---------------------------------------------------------------- repairs that are not


@pytest.mark.parametrize("fault", ["times_out", "skips_a_batch", "starts_past_the_gap", "stops_early"])
async def test_a_replay_that_does_not_cover_the_gap_is_no_repair(
    ctx: zmq.asyncio.Context, fault: str
) -> None:
    async with replaying_engine(ctx) as (router, subs, engine):
        await joined(engine, subs)
        await engine.publish([store(0, 1, None)])
        await wait_until(lambda: confirmed(router) == 1)
        first = engine.seq
        for _ in range(3):
            await engine.publish([], skip=True)
        if fault == "times_out":
            assert engine._task is not None
            engine._task.cancel()  # the replay socket takes the request and never answers
        elif fault == "skips_a_batch":
            del engine.sent[first + 1]
        elif fault == "starts_past_the_gap":
            del engine.sent[first]
        else:
            engine.sent = {s: b for s, b in engine.sent.items() if s < first + 2}  # ends before the gap's end
            engine.seq = first + 3
        subs.subscribers["w"].settings = subs.subscribers["w"].settings.model_copy(
            update={"replay_timeout_s": 0.5}
        )
        stats = subs.subscribers["w"].stats
        applied = stats.applied
        await engine.publish([store(1, 1, 100)])
        await wait_until(lambda: stats.applied > applied or stats.refused >= 1)
        assert router.precise.stats("w").replays == 0 and stats.replay_failures == 1
        assert router.precise.staleness("w", 100.0) == Staleness.GAP or stats.refused == 1


async def test_a_relayed_drop_notice_is_cleared_once_read(ctx: zmq.asyncio.Context) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router, subs, _ = setup(True, endpoint)
    await subs.sync()
    pub = FakePublisher(ctx, endpoint, bind=False)
    try:
        await joined(pub, subs)
        await pub.publish([store(0, 3, None)])
        await wait_until(lambda: confirmed(router) == 3)
        await pub.send_raw([b"kv", DROPPED_CONNECTION, b""])
        await pub.publish([])  # the next sequence: the same process, the notice read
        engine_restarted(subs)  # a restart would be confirmed: only the sequence tells
        pub.seq += 5
        await pub.publish([])  # a gap on the connection, not a reconnection any more
        await wait_until(lambda: router.precise.stats("w").gaps == 1)
        assert router.precise.stats("w").restarts == 0 and confirmed(router, 200.0) == 3
    finally:
        await pub.close()
        await subs.close()


async def test_a_workers_changed_kv_events_replace_its_subscriber() -> None:
    _router, subs, _ = setup(True, f"tcp://127.0.0.1:{free_port()}")
    await subs.sync()
    old = subs.subscribers["w"]
    worker = subs.pool.require("w")
    assert worker.kv_events is not None
    worker.kv_events = worker.kv_events.model_copy(update={"endpoint": f"tcp://127.0.0.1:{free_port()}"})
    await subs.sync()
    new = subs.subscribers["w"]
    assert new is not old and new.settings == worker.kv_events and new.running and not old.running
    await subs.close()


@pytest.mark.parametrize("host", ["*", "0.0.0.0", "[::]"])
def test_binding_every_interface_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match="not every interface"):
        WorkerSettings.model_validate(
            {"url": "http://127.0.0.1:9", "kv_events": {"endpoint": f"tcp://{host}:5557", "bind": True}}
        )
    connect = {"endpoint": f"tcp://{host}:5557", "bind": False}  # a wildcard is the engine's to bind
    assert WorkerSettings.model_validate({"url": "http://127.0.0.1:9", "kv_events": connect}).kv_events
    own = {"endpoint": "tcp://10.0.0.9:5557", "bind": True}
    assert WorkerSettings.model_validate({"url": "http://127.0.0.1:9", "kv_events": own}).kv_events
