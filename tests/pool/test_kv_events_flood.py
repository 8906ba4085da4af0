"""The KV event subscriber under a flood (loopback only, bounded in count): the event loop keeps serving
``/health`` while messages are queued, a flood past ``max_messages_per_s`` is shed and counted, an
oversized message is rejected, and a long stored chain is applied in pieces with the loop given back."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aiohttp
import zmq
import zmq.asyncio
from aiohttp import web

from prefix_router.events import BlockStored, EventBatch, encode_message
from prefix_router.pool.kv_events import APPLY_BLOCKS, YIELD_EVERY, EventSubscriptions, KvEventsCollector
from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.settings import WorkerSettings
from prefix_router.routing.precise import PreciseTuning, Staleness, precise_chain, precise_seed
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from support.kv_events import free_port
from support.waiting import wait_until

BS = 4
FLOOD = 20_000


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def setup(endpoint: str, **events: Any) -> tuple[Router, EventSubscriptions, Clock]:
    cfg = RoutingSettings.model_validate({"keys": {"mode": "events"}, "events": {"block_tokens": BS}})
    router = Router(cfg, precise=PreciseTuning(max_blocks_per_worker=100_000))
    pool = WorkerPool(router, 8)
    kv = {"endpoint": endpoint, "bind": True, "topic": "kv", "model": "m", "hwm": 100_000, **events}
    pool.add(WorkerSettings.model_validate({"url": "http://127.0.0.1:9", "name": "w", "kv_events": kv}))
    clock = Clock()
    return router, EventSubscriptions(pool, router, clock), clock


def small(seq: int) -> list[bytes]:
    """A valid one-block BlockStored, a new chain each time (what the audit's flood sent)."""
    event = BlockStored((seq,), None, (seq % 1000, 1, 2, 3), BS)
    return encode_message(b"kv", seq, EventBatch(0.0, (event,), 0))


def flood_from_a_thread(endpoint: str, count: int, sent: threading.Event) -> threading.Thread:
    """A publisher on its own ZMQ context and thread: it connects, waits for the subscription, then sends
    ``count`` messages as fast as ZMQ takes them (blocking instead of dropping at its high-water mark)."""

    def run() -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.XPUB)
        sock.setsockopt(zmq.LINGER, 30_000)  # every message delivered before the context ends
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(endpoint)
        try:
            if sock.poll(15_000):
                sock.recv()  # the router's subscription arrived: nothing sent from now on is dropped
                for seq in range(count):
                    sock.send_multipart(small(seq))
        finally:
            sent.set()
            sock.close()
            ctx.term()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def test_health_is_answered_while_a_flood_is_queued() -> None:
    """The loop is given back at least every ``YIELD_EVERY`` messages (seen by a task that runs once per
    loop turn), and ``/health`` on the same loop answers while the flood is still being read."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    _router, subs, _ = setup(endpoint, max_messages_per_s=1_000_000)
    await subs.sync()
    sub = subs.subscribers["w"]
    app = web.Application()

    async def ok(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/health", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    sent = threading.Event()
    thread = flood_from_a_thread(endpoint, FLOOD, sent)
    widest, answered_mid_flood, stop = 0, 0, False

    async def ticker() -> None:
        nonlocal widest
        last = sub.stats.received
        while not stop:
            await asyncio.sleep(0)
            widest = max(widest, sub.stats.received - last)
            last = sub.stats.received

    async def health() -> None:
        nonlocal answered_mid_flood
        async with aiohttp.ClientSession() as session:
            while not stop:
                async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                    assert resp.status == 200
                if 0 < sub.stats.received < FLOOD:
                    answered_mid_flood += 1
                await asyncio.sleep(0)

    tasks = [asyncio.create_task(ticker()), asyncio.create_task(health())]
    try:
        await asyncio.to_thread(sent.wait, 60)
        await wait_until(lambda: sub.stats.received == FLOOD, timeout_s=60)
    finally:
        stop = True
        await asyncio.gather(*tasks)
        await asyncio.to_thread(thread.join, 10)
        await runner.cleanup()
        await subs.close()
    assert sub.stats.applied == FLOOD and sub.stats.shed == 0
    assert widest <= YIELD_EVERY
    assert answered_mid_flood > 0


async def test_a_flood_past_the_rate_is_shed_counted_and_leaves_the_view_stale() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router, subs, clock = setup(endpoint, max_messages_per_s=500)
    await subs.sync()
    sub = subs.subscribers["w"]
    sent = threading.Event()
    thread = flood_from_a_thread(endpoint, 2_000, sent)
    try:
        await wait_until(lambda: sub.stats.received == 2_000, timeout_s=60)
        metrics = {
            tuple(s.labels.values()): s.value for m in KvEventsCollector(subs).collect() for s in m.samples
        }
    finally:
        await asyncio.to_thread(thread.join, 10)
        await subs.close()
    # the clock stands still: the one-second burst is all the bucket gives
    assert (sub.stats.decoded, sub.stats.shed) == (500, 1_500)
    assert router.precise.mapped_hashes("w") == 500
    assert router.precise.staleness("w", clock.now) == Staleness.GAP
    assert metrics[("w", "shed")] == 1_500


async def test_the_bucket_refills_with_time() -> None:
    _router, subs, clock = setup(f"tcp://127.0.0.1:{free_port()}", max_messages_per_s=2)
    await subs.sync()
    sub = subs.subscribers["w"]
    try:
        for seq in range(3):
            await sub.handle(small(seq))
        assert (sub.stats.applied, sub.stats.shed) == (2, 1)
        clock.now += 0.5  # one message's worth
        await sub.handle(small(3))
        await sub.handle(small(4))
        assert (sub.stats.applied, sub.stats.shed) == (3, 2)
    finally:
        await subs.close()


async def test_a_message_past_max_message_bytes_is_rejected() -> None:
    router, subs, _ = setup(f"tcp://127.0.0.1:{free_port()}", max_message_bytes=1_000)
    await subs.sync()
    sub = subs.subscribers["w"]
    try:
        tokens = tuple(range(BS * 100))
        big = encode_message(b"kv", 0, EventBatch(0.0, (BlockStored(tuple(range(100)), None, tokens, BS),)))
        assert sum(map(len, big)) > 1_000
        await sub.handle(big)
        assert (sub.stats.rejected, sub.stats.decoded, router.precise.mapped_hashes("w")) == (1, 0, 0)
        await sub.handle(small(0))
        assert sub.stats.applied == 1
    finally:
        await subs.close()


async def test_a_long_chain_is_applied_in_pieces_with_the_loop_given_back() -> None:
    """An 8,192-block event (a 128 k-token prompt at 16-token blocks): other tasks run between its pieces,
    and the keys are those of the whole chain."""
    router, subs, _ = setup(f"tcp://127.0.0.1:{free_port()}")
    await subs.sync()
    sub = subs.subscribers["w"]
    blocks = 8_192
    tokens = tuple(i % 50_000 for i in range(blocks * BS))
    event = BlockStored(tuple(range(1, blocks + 1)), None, tokens, BS, extra_keys=(None,) * blocks)
    seen: list[int] = []
    done = False

    async def ticker() -> None:
        while not done:
            seen.append(router.precise.held_blocks("w"))
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        await sub.handle(encode_message(b"kv", 0, EventBatch(0.0, (event,))))
    finally:
        done = True
        await task
        await subs.close()
    partial = sorted({n for n in seen if 0 < n < blocks})
    assert len(partial) >= blocks // APPLY_BLOCKS - 1
    assert all(b - a <= APPLY_BLOCKS for a, b in zip([0, *partial], [*partial, blocks], strict=True))
    chain = precise_chain(tokens, BS, precise_seed("m", None, None))
    assert router.precise.match(chain, 100.0).confirmed["w"] == blocks
