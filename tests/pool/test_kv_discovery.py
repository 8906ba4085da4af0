"""A worker's KV event endpoint discovered from what its engine advertises (SGLang's ``/server_info``,
fixture of the documented shape), and followed over real ZMQ by the router when ``kv_events`` is not
configured."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import zmq.asyncio
from aiohttp import web

from prefix_router.events import BlockStored
from prefix_router.pool.kv_discovery import advertised
from support.kv_events import FakePublisher, free_port
from support.waiting import wait_until

BS = 16


def with_events(info: dict[str, Any], **events: Any) -> dict[str, Any]:
    config = json.loads(info["kv_events_config"]) | events
    return info | {"kv_events_config": json.dumps(config)}


def answer(response: web.Response) -> Any:
    """An SGLang endpoint's handler: always ``response`` (one request each: a response is sent once)."""
    body, status, headers = response.body, response.status, dict(response.headers)

    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=body, status=status, headers=headers)

    return handler


def test_the_advert_names_the_worker_s_host(fixture_json: Any) -> None:
    info = fixture_json("sglang_server_info_kv_events.json")
    got = advertised(info, "http://10.1.2.3:30000").settings
    assert got is not None
    assert (got.endpoint, got.bind, got.topic, got.replay_endpoint) == (
        "tcp://10.1.2.3:5557", False, "kv@sglang", "tcp://10.1.2.3:5558",
    )  # fmt: skip
    v6 = advertised(with_events(info, endpoint="tcp://0.0.0.0:6000"), "http://[fd00::7]:30000").settings
    assert v6 is not None and v6.endpoint == "tcp://[fd00::7]:6000"


def test_no_advert_when_the_router_could_not_follow_it(fixture_json: Any) -> None:
    info = fixture_json("sglang_server_info_kv_events.json")
    url = "http://10.1.2.3:30000"
    for bad in (
        info | {"kv_events_config": None},  # events not enabled
        info | {"kv_events_config": "{not json"},
        info | {"dp_size": 2},  # one publisher per rank, each its own sequence
        with_events(info, endpoint="tcp://10.9.9.9:5557"),  # the engine connects to a router it was told of
        with_events(info, endpoint="ipc:///tmp/kv"),  # another machine's path
        with_events(info, publisher="null"),
    ):
        advert = advertised(bad, url)
        assert advert.settings is None and advert.reason


async def test_the_router_follows_an_advertised_endpoint(
    fixture_json: Any, fixture_text: Any, serve_app: Any, start_router: Any
) -> None:
    port = free_port()
    info = with_events(fixture_json("sglang_server_info_kv_events.json"), endpoint=f"tcp://*:{port}")
    info.pop("replay_endpoint", None)
    app = web.Application()
    app.router.add_get("/server_info", answer(web.json_response(info)))
    app.router.add_get("/v1/models", answer(web.json_response(fixture_json("sglang_models.json"))))
    app.router.add_get("/metrics", answer(web.Response(text=fixture_text("sglang_v0.4_metrics.txt"))))
    app.router.add_get("/health", answer(web.Response()))
    engine = await serve_app(app)
    ctx = zmq.asyncio.Context()
    pub = FakePublisher(ctx, f"tcp://127.0.0.1:{port}", bind=True, topic=b"kv@sglang")
    pub.tagged = False  # SGLang's events are positional arrays
    try:
        router = await start_router(
            {"url": engine.url, "name": "sg"},
            settings={"routing.keys.mode": "events", "routing.events.block_tokens": BS},
        )
        state = router.state
        worker = state.pool.require("sg")
        assert worker.kv_events is not None and worker.kv_events.endpoint == f"tcp://127.0.0.1:{port}"
        await wait_until(lambda: "sg" in state.events.subscribers, timeout_s=10)  # type: ignore[union-attr]
        sub = state.events.subscribers["sg"]  # type: ignore[union-attr]
        while not sub.stats.decoded:  # the slow joiner
            await pub.publish([])
            await asyncio.sleep(0.02)
        await pub.publish([BlockStored((7, 8), None, tuple(range(2 * BS)), BS, medium="GPU")])
        await wait_until(lambda: state.router.precise.held_blocks("sg") == 2)
    finally:
        await pub.close()
        ctx.term()
