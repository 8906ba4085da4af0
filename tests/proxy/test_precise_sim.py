"""Precise mode end to end on simulated engines: ``engine-sim`` apps publishing their caches' KV events over
real ZMQ (both layouts, both socket directions), the router (``serve``'s app) subscribed to them, the
official ``openai`` client through it. The figures are simulated; the event path (sockets, framing,
msgpack, decoding, the event-fed view) is the real one."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from prefix_router.lab.launch.net import restartable_ports
from prefix_router.lab.sim.kv_publisher import KvEventsConfig
from prefix_router.lab.sim.server import CONTEXT, EngineSimSettings, build_app
from prefix_router.node.life.server import Running, start
from prefix_router.protocol import MATCH_HEADER, WORKER_HEADER
from support.waiting import wait_until

MODEL = "sim"
SYSTEM = "You answer questions about parcels, politely and briefly. " * 30


@dataclass
class SimEngine:
    """One engine-sim app with its event endpoints, restartable on the same ports (a new process)."""

    name: str
    port: int
    events: KvEventsConfig
    running: Running | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def published(self) -> int:
        """Batches this engine process has sent."""
        assert self.running is not None
        publisher = self.running.runner.app[CONTEXT].events
        assert publisher is not None
        return publisher.seq

    async def start(self) -> None:
        cfg = EngineSimSettings(model=MODEL, time_scale=0.02, port=self.port, kv_events=self.events)
        self.running = await start(build_app(cfg), port=self.port, shutdown_timeout=0.2)

    async def stop(self) -> None:
        if self.running is not None:
            await self.running.stop()
            self.running = None

    async def reset(self) -> None:
        async with aiohttp.ClientSession() as http, http.post(self.url + "/reset_prefix_cache") as resp:
            assert resp.status == 200


Fleet = Callable[..., Awaitable[tuple[list[SimEngine], Any]]]


@pytest.fixture
async def fleet(start_router: Any) -> AsyncIterator[Fleet]:
    """``await fleet(n, engine_binds=..., tagged=...)``: n event-publishing engine-sims and a router in
    precise mode subscribed to them (each subscriber has seen a message before it returns)."""
    engines: list[SimEngine] = []

    async def make(n: int, *, engine_binds: bool, tagged: bool) -> tuple[list[SimEngine], Any]:
        entries = []
        # distinct and below the ephemeral range: engines bind some of them after the router started, and
        # a port from bind(0) could be an outgoing connection's by then (seen: a replay port)
        ports = restartable_ports("127.0.0.1", 3 * n)
        for i in range(n):
            port, replay, http_port = ports[3 * i : 3 * i + 3]
            # vLLM's rule: a wildcard endpoint binds (the router connects), a host name connects
            endpoint = f"tcp://*:{port}" if engine_binds else f"tcp://127.0.0.1:{port}"
            events = KvEventsConfig(endpoint, f"tcp://127.0.0.1:{replay}", "kv", tagged=tagged)
            engine = SimEngine(f"sim{i}", http_port, events)
            engines.append(engine)
            entries.append({
                "url": engine.url, "name": engine.name, "models": [MODEL],
                "kv_events": {"endpoint": f"tcp://127.0.0.1:{port}", "bind": not engine_binds, "topic": "kv",
                              "replay_endpoint": events.replay_endpoint},
            })  # fmt: skip
            if engine_binds:
                await engine.start()
        router = await start_router(
            *entries, settings={"routing.keys.mode": "events", "routing.events.block_tokens": 16}
        )
        for engine in engines[-n:]:
            if engine.running is None:  # started after the router (it binds): admitted as if probed
                await engine.start()
                router.admit(engine.name)
        for engine in engines[-n:]:
            await until_heard(router, engine)
        return engines[-n:], router

    try:
        yield make
    finally:
        for engine in engines:
            await engine.stop()


async def until_heard(router: Any, engine: SimEngine) -> None:
    """Reset the engine's cache until the router's subscriber has a message from it (ZMQ's slow joiner:
    a subscription takes a moment to reach the publisher); the view is empty after it."""
    sub = router.state.events.subscribers[engine.name]
    for _ in range(200):
        await engine.reset()
        try:
            await wait_until(lambda: sub.stats.decoded > 0, timeout_s=0.05)
            return
        except AssertionError:
            continue
    raise AssertionError(f"{engine.name}: no event reached the router")


async def caught_up(router: Any, engine: SimEngine) -> None:
    """Wait until the router applied every batch the engine has sent."""
    precise = router.state.router.precise
    await wait_until(lambda: precise.summary(engine.name, 0.0)["last_seq"] == engine.published() - 1)


def messages(question: str) -> list[Any]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


async def ask(router: Any, question: str, **extra: Any) -> tuple[str, int, int, int]:
    """One chat completion through the router: (worker, predicted, engine-reported cached, prompt)."""
    async with router.openai() as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages(question), max_tokens=4, **extra
        )
        usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return raw.headers[WORKER_HEADER], int(raw.headers[MATCH_HEADER]), cached, usage.prompt_tokens


@pytest.mark.parametrize(
    ("engine_binds", "tagged"),
    [(True, True), (False, False)],
    ids=["engine-binds-tagged", "router-binds-positional"],
)
async def test_predictions_equal_the_engines_cached_tokens(
    fleet: Fleet, engine_binds: bool, tagged: bool
) -> None:
    engines, router = await fleet(3, engine_binds=engine_binds, tagged=tagged)
    by_name = {e.name: e for e in engines}
    first, predicted, cached, prompt = await ask(router, "Where is parcel 7?")
    assert (predicted, cached) == (0, 0)
    await caught_up(router, by_name[first])
    held = router.state.router.precise.held_blocks(first)
    assert held == prompt // 16  # every full block of the prompt, as the engine's events said
    for question in ("Where is parcel 7?", "Where is parcel 8?", "And parcel 9, where is it?"):
        worker, predicted, cached, _ = await ask(router, question)
        assert worker == first  # the shared system prompt is held there
        assert predicted == cached > 0  # the prediction is what the engine reports
        await caught_up(router, by_name[worker])
    salted = await ask(router, "Where is parcel 7?", extra_body={"cache_salt": "tenant-b"})
    assert salted[1] == salted[2] == 0  # a salted request shares nothing with unsalted blocks
    await caught_up(router, by_name[salted[0]])
    again = await ask(router, "Where is parcel 7?", extra_body={"cache_salt": "tenant-b"})
    assert again[0] == salted[0] and again[1] == again[2] > 0


async def test_a_cache_reset_and_a_restart_clear_the_view(fleet: Fleet) -> None:
    engines, router = await fleet(2, engine_binds=False, tagged=True)
    precise = router.state.router.precise
    worker, *_ = await ask(router, "Where is parcel 7?")
    engine = next(e for e in engines if e.name == worker)
    await caught_up(router, engine)
    assert precise.held_blocks(worker) > 0
    await engine.reset()
    await wait_until(lambda: precise.held_blocks(worker) == 0)  # AllBlocksCleared
    worker, predicted, cached, _ = await ask(router, "Where is parcel 7?")
    assert predicted == cached == 0  # on whichever engine: none holds it now
    engine = next(e for e in engines if e.name == worker)
    await caught_up(router, engine)
    assert precise.held_blocks(worker) > 0
    restarts = precise.stats(worker).restarts
    await engine.stop()
    # what the pool's probe of the stopped engine reports: the engine's own sign of a restart, without
    # which a sequence from 0 again is refused (a second publisher could send it; docs/security.md)
    router.state.pool.report(router.state.pool.require(worker), False, "connection refused")
    await engine.start()  # a new engine process: an empty cache, its sequence from 0 again
    for _ in range(200):  # its publisher reconnects: what it sends before that is lost (slow joiner)
        await engine.reset()
        with contextlib.suppress(AssertionError):
            await wait_until(lambda: precise.stats(worker).restarts == restarts + 1, timeout_s=0.05)
            break
    assert precise.stats(worker).restarts == restarts + 1
    assert precise.held_blocks(worker) == 0
    _, predicted, cached, _ = await ask(router, "Where is parcel 7?")
    assert predicted == cached == 0
