"""``serve --processes 2`` with a worker whose KV events the router binds: the fan-out process binds the
endpoint once and every serving process gets every message (an engine-sim publishing over real ZMQ)."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import zmq

from prefix_router.events import DROPPED_CONNECTION
from prefix_router.lab.sim.kv_publisher import KvEventsConfig
from prefix_router.lab.sim.server import CONTEXT, EngineSimSettings, build_app
from prefix_router.node.config import load_config
from prefix_router.node.life.server import start
from prefix_router.proxy.run.event_fanout import (
    MAX_TOPICS,
    FanoutPlan,
    _bind_pair,
    _forward,
    _track,
    fanned_out,
    wanted,
)
from support.net import free_port
from support.waiting import wait_until

TOKEN = "admin-token-for-fanout-tests"
SYSTEM = "You answer questions about parcels, politely and briefly. " * 30


def test_only_router_bound_endpoints_are_fanned_out(tmp_path: Path) -> None:
    events = {"endpoint": "tcp://127.0.0.1:5557", "bind": True, "hwm": 50, "max_message_bytes": 4096}
    config = load_config(env={}, overrides={"workers": [
        {"url": "http://a:1", "name": "a", "kv_events": events},
        {"url": "http://b:1", "name": "b", "kv_events": events | {"hwm": 70}},  # one endpoint, two engines
        {"url": "http://c:1", "name": "c", "kv_events": {"endpoint": "tcp://c:5557"}},  # the engine binds
        {"url": "http://d:1", "name": "d"},
    ], "routing.keys.mode": "events"})  # fmt: skip
    plan = wanted(config, tmp_path)
    assert plan == {"tcp://127.0.0.1:5557": (f"ipc://{tmp_path}/kv-events-0", 70, 4096)}
    out = fanned_out(config, FanoutPlan({k: v[0] for k, v in plan.items()}))
    got = {w.name: w.kv_events for w in out.workers}
    ipc = plan["tcp://127.0.0.1:5557"][0]
    assert [(e.endpoint, e.bind) if e else None for e in (got["a"], got["b"])] == [(ipc, False)] * 2
    assert got["c"] == config.workers[2].kv_events and got["d"] is None
    assert fanned_out(config, FanoutPlan()) is config  # nothing bound by the fan-out: as configured


def test_an_engines_dropped_connection_reaches_each_topic_before_its_next_message(tmp_path: Path) -> None:
    ctx = zmq.Context()
    upstream, downstream = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
    port = free_port()
    upstream.bind(f"tcp://127.0.0.1:{port}")
    downstream.bind(f"ipc://{tmp_path}/fanout")
    thread = threading.Thread(target=_forward, args=(upstream, downstream), daemon=True)
    thread.start()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    sub.connect(f"ipc://{tmp_path}/fanout")

    def engine(seq: int) -> zmq.Socket[bytes]:
        """A publisher that sends until the subscriber hears it (a connecting PUB drops what goes first)."""
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(f"tcp://127.0.0.1:{port}")
        sub.setsockopt(zmq.RCVTIMEO, 20)
        for _ in range(500):
            pub.send_multipart([b"kv", seq.to_bytes(8, "big"), b"batch"])
            with contextlib.suppress(zmq.Again):
                assert sub.recv_multipart()[1] == seq.to_bytes(8, "big")
                break
        else:
            raise AssertionError("the fan-out never forwarded a message")
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
        return pub

    try:
        engine(7).close(0)  # the engine dies: the kernel closes its connection
        heard = [sub.recv_multipart()]
        while heard[-1][1] != DROPPED_CONNECTION:
            heard.append(sub.recv_multipart())
        assert heard[-1] == [b"kv", DROPPED_CONNECTION, b""]
        assert all(frames[1] == (7).to_bytes(8, "big") for frames in heard[:-1])  # late copies only
        engine(9).close(0)  # a new process is heard as before
    finally:
        sub.close(0)
        ctx.term()  # the forwarder closes its sockets and returns
        thread.join(5)
    assert not thread.is_alive()


def test_the_fanout_caps_every_message_it_takes_and_drops_an_oversized_one(tmp_path: Path) -> None:
    """Both sockets of a fanned-out endpoint carry ``MAXMSGSIZE`` (before: none, so one publisher's huge
    message was buffered whole before any serving process's cap); a message over it never reaches the
    serving processes, and the publisher's next ones do (ZMQ drops it, its publisher reconnects)."""
    ctx = zmq.Context()
    port = free_port()
    pair = _bind_pair(ctx, f"tcp://127.0.0.1:{port}", f"ipc://{tmp_path}/fanout", 1000, 4096)
    assert pair is not None
    upstream, downstream = pair
    assert upstream.getsockopt(zmq.MAXMSGSIZE) == downstream.getsockopt(zmq.MAXMSGSIZE) == 4096
    thread = threading.Thread(target=_forward, args=pair, daemon=True)
    thread.start()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.setsockopt(zmq.RCVTIMEO, 20)
    sub.connect(f"ipc://{tmp_path}/fanout")
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(f"tcp://127.0.0.1:{port}")
    heard: list[int] = []
    drops = 0
    try:
        for _ in range(500):
            pub.send_multipart([b"kv", b"\x00" * 8, b"x" * 8192])  # over the cap
            pub.send_multipart([b"kv", b"\x00" * 8, b"small"])
            with contextlib.suppress(zmq.Again):
                frames = sub.recv_multipart()
                if frames[1] == DROPPED_CONNECTION:
                    drops += 1  # the oversized message cut the publisher's connection
                else:
                    heard.append(len(frames[2]))
            if len(heard) >= 3 and drops:
                break
    finally:
        for sock in (sub, pub):
            sock.close(0)
        ctx.term()
        thread.join(5)
    assert len(heard) >= 3 and set(heard) == {5} and drops


def test_the_topics_tracked_for_drop_notices_are_bounded() -> None:
    topics: set[bytes] = set()
    for i in range(MAX_TOPICS + 50):
        _track(topics, b"\x01" + b"t%d" % i)
    assert len(topics) == MAX_TOPICS
    _track(topics, b"\x00t0")
    _track(topics, b"\x00never-subscribed")
    assert len(topics) == MAX_TOPICS - 1 and b"t0" not in topics


def listeners(port: int) -> int:
    """Listening TCP sockets on ``port`` (one per serving process: ``SO_REUSEPORT``)."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for row in rows if int(row[1].split(":")[1], 16) == port and row[3] == "0A")


async def views(url: str, samples: int = 12) -> list[dict[str, Any] | None]:
    """The sim worker's precise view as ``samples`` fresh connections see it (the kernel spreads them over
    the processes); None where the answering process has no event-fed view of it."""
    out = []
    for _ in range(samples):
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            resp = await http.get(url + "/admin/routing", headers={"Authorization": f"Bearer {TOKEN}"})
            body = orjson.loads(await resp.read())
        out.append(body["summary"]["workers"]["sim"].get("precise"))
    return out


@pytest.mark.timeout(120)
async def test_every_process_gets_every_event(tmp_path: Path, serve_process: Any) -> None:
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"  # not a wildcard: the engine connects, the router binds
    cfg = EngineSimSettings(model="sim", time_scale=0.02, kv_events=KvEventsConfig(endpoint, topic="kv"))
    engine = await start(build_app(cfg), shutdown_timeout=0.2)
    publisher = engine.runner.app[CONTEXT].events
    assert publisher is not None
    config = tmp_path / "serve.yaml"
    worker = {"url": engine.url, "name": "sim", "models": ["sim"],
              "kv_events": {"endpoint": endpoint, "bind": True, "topic": "kv"}}  # fmt: skip
    config.write_text(
        json.dumps(
            {"workers": [worker], "routing": {"keys": {"mode": "events"}, "events": {"block_tokens": 16}}}
        )
    )
    try:
        served = await serve_process(
            "--config", str(config), "--processes", "2", "--set", f"auth.admin_token={TOKEN}",
            "--set", "log_level=warning", "--set", "scrape.interval_s=3600",
        )  # fmt: skip
        port = int(served.url.rsplit(":", 1)[1])
        await wait_until(lambda: listeners(port) == 2, timeout_s=30)  # both processes answer from now on

        async def heard_everywhere() -> bool:
            async with aiohttp.ClientSession() as http:
                await (await http.post(engine.url + "/reset_prefix_cache")).read()
            seen = await views(served.url)
            return all(v is not None and v["last_seq"] == publisher.seq - 1 for v in seen)

        for _ in range(100):  # each process's subscription takes a moment to reach the engine
            if await heard_everywhere():
                break
        else:
            raise AssertionError(f"not every process hears the engine: {await views(served.url)}")
        question = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "parcel 7?"}]
        body = {"model": "sim", "max_tokens": 4, "messages": question}
        async with aiohttp.ClientSession() as http:
            resp = await http.post(served.url + "/v1/chat/completions", json=body)
            prompt = orjson.loads(await resp.read())["usage"]["prompt_tokens"]
        for _ in range(100):  # every process holds the blocks its own events said
            seen = await views(served.url)
            if all(v is not None and v["blocks"]["events"] == prompt // 16 for v in seen):
                break
        else:
            raise AssertionError(f"not every process holds the prompt's {prompt // 16} blocks: {seen}")
        assert not served.lines("cannot bind")
    finally:
        await engine.stop()
