"""Precise mode through the real HTTP proxy: workers with ``kv_events`` (the router binds, a stand-in
engine publishes over real ZMQ), routing and the prediction header following the events, the approximate
worker beside them (hybrid), and the counters on ``/metrics`` and ``/admin/routing``."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from prefix_router.events import BlockStored
from support.bodies import ask
from support.client import routed
from support.kv_events import FakePublisher, free_port
from support.waiting import wait_until

TOKEN = "admin-token-for-precise-tests"
BS = 16
SYSTEM = "You answer questions about parcels, politely and briefly. " * 40


def chat(question: str) -> dict[str, Any]:
    return ask(question, SYSTEM)


async def test_routing_and_predictions_follow_the_engines_events(
    fake_engine: Any, start_router: Any, model_dirs: dict[str, Any]
) -> None:
    engines = [await fake_engine(name) for name in ("a", "b", "c")]
    ports = {"a": free_port(), "b": free_port()}
    entries: list[dict[str, Any]] = [{"url": e.url, "name": e.name, "models": ["m"]} for e in engines]
    for entry in entries[:2]:
        entry["kv_events"] = {
            "endpoint": f"tcp://127.0.0.1:{ports[entry['name']]}",
            "bind": True,
            "topic": "kv",
        }
    settings = {
        "auth.admin_token": TOKEN,
        "routing.keys.mode": "events",
        "routing.keys.templates": {"m": str(model_dirs["smollm2"].path)},
        "routing.events.block_tokens": BS,
    }
    router = await start_router(*entries, settings=settings)
    state = router.state
    ctx = zmq.asyncio.Context()
    pubs = {name: FakePublisher(ctx, f"tcp://127.0.0.1:{port}", bind=False) for name, port in ports.items()}
    try:
        for name, pub in pubs.items():  # until each subscriber has one message (ZMQ's slow joiner)
            sub = state.events.subscribers[name]  # type: ignore[union-attr]
            while not sub.stats.decoded:
                await pub.publish([])
                await asyncio.sleep(0.02)
        body = chat("Where is parcel 7?")
        ids = state.router.keys.templates["m"].chat_ids(body)
        full = len(ids) // BS * BS
        held = full - 2 * BS  # b's engine holds all but the last two full blocks of the prompt
        event = BlockStored(tuple(range(1, held // BS + 1)), None, tuple(ids[:held]), BS)
        await pubs["b"].publish([event])
        await wait_until(lambda: state.router.precise.held_blocks("b") == held // BS)
        assert await routed(router.url, body) == ("b", held)
        assert await routed(router.url, chat("Where is parcel 7?")) == ("b", held)  # the same: no event yet

        async with aiohttp.ClientSession() as http:
            text = await (await http.get(router.url + "/metrics")).text()
            resp = await http.get(router.url + "/admin/routing", headers={"Authorization": f"Bearer {TOKEN}"})
            summary = orjson.loads(await resp.read())["summary"]
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        assert (
            samples[("prefix_router_kv_events_messages_total", (("outcome", "decoded"), ("worker", "b")))]
            >= 2
        )
        assert samples[("prefix_router_kv_events_fresh", (("worker", "b"),))] == 1
        stored = ("prefix_router_kv_events_blocks_total", (("kind", "stored"), ("worker", "b")))
        assert samples[stored] == held // BS
        assert samples[("prefix_router_worker_blocks", (("source", "events"), ("worker", "b")))] == held // BS
        assert samples[("prefix_router_worker_blocks", (("source", "speculative"), ("worker", "b")))] == 2
        assert ("prefix_router_kv_events_fresh", (("worker", "c"),)) not in samples  # no events: approximate
        precise = summary["workers"]["b"]["precise"]
        assert precise["state"] == "fresh" and precise["blocks"] == {"events": held // BS, "speculative": 2}
        assert "precise" not in summary["workers"]["c"]
    finally:
        for pub in pubs.values():
            await pub.close()
        ctx.term()


def fake_ids(body: dict[str, Any]) -> list[int]:
    """The stand-in engine's tokenizer: one id per byte of the messages' contents."""
    return list("".join(str(m["content"]) for m in body["messages"]).encode())


async def test_without_a_local_template_the_engine_renders_the_request(
    fake_engine: Any, start_router: Any
) -> None:
    a = await fake_engine("a", render_ids=fake_ids)
    b = await fake_engine("b", render_ids=fake_ids)
    port = free_port()
    entries: list[dict[str, Any]] = [
        {"url": a.url, "name": "a", "models": ["m"]},
        {"url": b.url, "name": "b", "models": ["m"],
         "kv_events": {"endpoint": f"tcp://127.0.0.1:{port}", "bind": True, "topic": "kv"}},
    ]  # fmt: skip
    router = await start_router(
        *entries, settings={"routing.keys.mode": "events", "routing.events.block_tokens": BS}
    )
    state = router.state
    ctx = zmq.asyncio.Context()
    pub = FakePublisher(ctx, f"tcp://127.0.0.1:{port}", bind=False)
    try:
        sub = state.events.subscribers["b"]  # type: ignore[union-attr]
        while not sub.stats.decoded:
            await pub.publish([])
            await asyncio.sleep(0.02)
        body = chat("Where is parcel 8?")
        ids = fake_ids(body)
        held = len(ids) // BS * BS
        await pub.publish([BlockStored(tuple(range(1, held // BS + 1)), None, tuple(ids[:held]), BS)])
        await wait_until(lambda: state.router.precise.held_blocks("b") == held // BS)
        assert await routed(router.url, body) == ("b", held)
        assert await routed(router.url, body) == ("b", held)
        renders = state.renders
        assert renders is not None and (renders.stats.requests, renders.stats.cached) == (1, 1)
        assert len([s for s in b.seen if s.path.endswith("/render")]) == 1 and not a.generations
        b.b.render_status = 500  # a failing render: the approximate view, nothing else changes
        worker, _ = await routed(router.url, chat("Something else entirely?"))
        assert worker in ("a", "b") and renders.stats.failures == 1
    finally:
        await pub.close()
        ctx.term()
