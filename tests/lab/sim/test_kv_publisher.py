"""The simulated engine's KV event publisher (``lab/sim/kv_publisher.py``) over real ZMQ sockets, read back
with the router's decoder (``prefix_router.events``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from prefix_router.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventMessage,
    decode_message,
    decode_replay,
    seq_bytes,
)
from prefix_router.lab.sim.kv_publisher import BlockBook, KvEventPublisher, KvEventsConfig
from prefix_router.lab.sim.kvcache import PrefixCache
from support.net import free_port

BS = 4


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.term()


async def receive(sub: zmq.asyncio.Socket) -> EventMessage:
    return decode_message(await asyncio.wait_for(sub.recv_multipart(), 5))


async def subscribed(ctx: zmq.asyncio.Context, pub: KvEventPublisher, port: int) -> zmq.asyncio.Socket:
    """A SUB socket connected to ``pub`` that has received one message (the slow joiner's wait)."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(f"tcp://127.0.0.1:{port}")
    while not await sub.poll(20):
        pub.listener("cleared", 0)
        pub.flush()
    await sub.recv_multipart()
    return sub


@pytest.mark.parametrize("tagged", [True, False])
async def test_a_cache_s_events_as_the_router_decodes_them(ctx: zmq.asyncio.Context, tagged: bool) -> None:
    port = free_port()
    pub = KvEventPublisher(KvEventsConfig(f"tcp://*:{port}", topic="kv", tagged=tagged), BS)
    cache = PrefixCache(capacity_blocks=3, block_tokens=BS)
    cache.listener = pub.listener
    sub = await subscribed(ctx, pub, port)
    try:
        pub.book.remember([11, 12, 13], ids(3 * BS), "salt-a")
        assert cache.allocate([11, 12, 13], 3) is not None
        cache.mark_computed([11, 12, 13])
        pub.flush()
        message = await receive(sub)
        (event,) = message.batch.events  # one chained run in one event
        assert event == BlockStored(
            (11, 12, 13), None, tuple(ids(3 * BS)), BS, medium="GPU", extra_keys=(("salt-a",), None, None)
        )
        cache.release([11, 12, 13], 0)
        pub.book.remember([21], ids(BS, 100), None)
        assert cache.allocate([21], 1) is not None  # evicts the least recently used: the chain's tail
        cache.mark_computed([21])
        pub.flush()
        events = (await receive(sub)).batch.events
        assert events == (
            BlockRemoved((13,), "GPU"),
            BlockStored((21,), None, tuple(ids(BS, 100)), BS, medium="GPU"),
        )
        cache.reset()
        pub.flush()
        last = await receive(sub)
        assert last.batch.events == (AllBlocksCleared(),) and last.seq == message.seq + 2
        pub.flush()  # nothing queued: nothing sent
        assert not await sub.poll(50)
    finally:
        sub.close(0)
        await pub.close()


async def test_replays_answer_from_a_sequence_on(ctx: zmq.asyncio.Context) -> None:
    replay = f"tcp://127.0.0.1:{free_port()}"
    pub = KvEventPublisher(KvEventsConfig(f"tcp://*:{free_port()}", replay, "kv", buffer_steps=3), BS)
    pub.start_replays()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        for _ in range(5):
            pub.listener("cleared", 0)
            pub.flush()
        dealer.connect(replay)
        await dealer.send_multipart([b"", seq_bytes(1)])
        answers = []
        while (answer := decode_replay(await asyncio.wait_for(dealer.recv_multipart(), 5))) is not None:
            answers.append(answer.seq)
        assert answers == [2, 3, 4]  # only the last buffer_steps batches are kept
    finally:
        dealer.close(0)
        await pub.close()


def test_the_block_book_is_bounded() -> None:
    book = BlockBook(capacity=4, block_tokens=BS)
    book.remember([1, 2, 3], ids(3 * BS), None)
    book.remember([1, 2, 5, 6], ids(4 * BS), None)
    assert len(book) == 4 and book.get(3) is None  # the oldest went
    entry = book.get(5)
    assert entry is not None and entry.parent == 2 and entry.tokens == tuple(ids(BS, 2 * BS))
    book.remember([7, 8], ids(BS), None)  # the second block has no full token run: not kept
    assert book.get(7) is not None and book.get(8) is None


def test_the_config_is_vllm_s() -> None:
    cfg = KvEventsConfig.from_json(
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv",'
        ' "replay_endpoint": "tcp://*:5558", "max_queue_size": 10}',
        tagged=False,
    )
    assert cfg is not None and cfg.binds and not cfg.tagged and cfg.replay_endpoint == "tcp://*:5558"
    assert not KvEventsConfig("tcp://10.0.0.9:5557").binds  # a host name: the publisher connects
    assert KvEventsConfig.from_json('{"enable_kv_cache_events": false}') is None
    for bad in ('{"endpont": "tcp://*:1"}', '{"publisher": "kafka"}', "[1]", '{"endpoint": "udp://x:1"}'):
        with pytest.raises(ValueError):
            KvEventsConfig.from_json(bad)
