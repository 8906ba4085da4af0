"""What a KV event flood does to everybody else: ``/health`` latency on the same event loop as a worker's
event subscriber while a publisher on loopback sends ``--messages`` small valid ``BlockStored`` messages as
fast as ZeroMQ takes them, and the process's RSS; then one ``--blocks``-block event (a long prompt).

    python benchmarks/kv_events_flood.py [--messages 120000] [--rate 1000000] [--blocks 8192]

``--rate`` is the subscriber's ``max_messages_per_s`` (messages past it are shed undecoded; default: its
default); the socket's ``hwm`` is raised to 1 M messages so that ZeroMQ drops none.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

import aiohttp
import psutil
import zmq
from aiohttp import web

from prefix_router.events import BlockStored, EventBatch, encode_message
from prefix_router.lab.launch.net import free_port
from prefix_router.pool import EventSubscriptions, WorkerPool, WorkerSettings
from prefix_router.routing import Router, RoutingSettings

BS = 16


def publish(endpoint: str, count: int, done: threading.Event) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(endpoint)
    if sock.poll(15_000):
        sock.recv()
        for seq in range(count):
            event = BlockStored((seq,), None, tuple(range(seq % 1000, seq % 1000 + BS)), BS)
            sock.send_multipart(encode_message(b"kv", seq, EventBatch(time.time(), (event,), 0)))
    done.set()
    sock.close()
    ctx.term()


async def probe(url: str, stop: asyncio.Event, out: list[float]) -> None:
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            began = time.perf_counter()
            async with session.get(url) as resp:
                await resp.read()
            out.append((time.perf_counter() - began) * 1000)
            await asyncio.sleep(0.01)


def summary(name: str, ms: list[float]) -> str:
    if not ms:
        return f"{name}: no answer"
    return f"{name}: {len(ms)} answers, p50 {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms"


async def main(messages: int, rate: float | None, blocks: int) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    cfg = RoutingSettings.model_validate({"keys": {"mode": "events"}, "events": {"block_tokens": BS}})
    router = Router(cfg)
    pool = WorkerPool(router, 8)
    kv = {"endpoint": endpoint, "bind": True, "topic": "kv", "model": "m", "hwm": 1_000_000}
    if rate is not None:
        kv["max_messages_per_s"] = rate
    pool.add(WorkerSettings.model_validate({"url": "http://127.0.0.1:9", "name": "w", "kv_events": kv}))
    subs = EventSubscriptions(pool, router, time.monotonic)
    await subs.sync()
    sub = subs.subscribers["w"]
    app = web.Application()

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/health"
    rss = psutil.Process().memory_info().rss >> 20
    quiet: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(probe(url, stop, quiet))
    await asyncio.sleep(2)
    stop.set()
    await task
    flood: list[float] = []
    stop = asyncio.Event()
    done = threading.Event()
    thread = threading.Thread(target=publish, args=(endpoint, messages, done), daemon=True)
    began = time.perf_counter()
    thread.start()
    task = asyncio.create_task(probe(url, stop, flood))
    last, still = -1, 0.0
    while time.perf_counter() - began < 300 and still < 1.0:  # sent, and nothing more for 1 s
        await asyncio.sleep(0.05)
        if done.is_set() and sub.stats.received == last:
            still += 0.05
        else:
            last, still = sub.stats.received, 0.0
    took = time.perf_counter() - began - still
    stop.set()
    await task
    peak = psutil.Process().memory_info().rss >> 20
    print(summary("quiet", quiet))
    print(summary("flood", flood))
    s = sub.stats
    print(
        f"flood: {s.received} received in {took:.1f} s, {s.applied} applied, "
        f"{getattr(s, 'shed', 0)} shed, {s.disconnects} disconnects; "
        f"RSS {rss} -> {peak} MB"
    )
    big: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(probe(url, stop, big))
    await asyncio.sleep(0.2)
    tokens = tuple(i % 50_000 for i in range(blocks * BS))
    event = BlockStored(tuple(range(10**9, 10**9 + blocks)), None, tokens, BS)
    handled = time.perf_counter()
    await sub.handle(encode_message(b"kv", messages + 10, EventBatch(time.time(), (event,), 0)))
    handled = time.perf_counter() - handled
    await asyncio.sleep(0.2)
    stop.set()
    await task
    print(summary(f"one {blocks}-block event ({handled * 1000:.0f} ms to apply)", big))
    await runner.cleanup()
    await subs.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=120_000)
    parser.add_argument("--rate", type=float, default=None)
    parser.add_argument("--blocks", type=int, default=8192)
    args = parser.parse_args()
    asyncio.run(main(args.messages, args.rate, args.blocks))
