"""Every body mode Envoy 1.40 accepts for the ext_proc filter, through a real Envoy in front of one real
picker and one test engine, with the official ``openai`` client, plain and streamed.

The request body FULL_DUPLEX_STREAMED (the Gateway API Inference Extension's reference) or BUFFERED; the
response body NONE, STREAMED, BUFFERED or FULL_DUPLEX_STREAMED (the reference); trailers SEND or SKIP
(Envoy requires SEND on a FULL_DUPLEX_STREAMED side); with and without ``allow_mode_override``; with and
without the metadata options (``envoy.lb`` received and forwarded, the response attributes). One Envoy
serves every combination, each on its own listener (``EnvoyOptions.listeners``, on ports Envoy picks): one
start, not 60."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from prefix_router.epp import EppSettings, RunningEpp, create_control_app, start_epp
from prefix_router.lab.launch.envoy import (
    EnvoyOptions,
    EnvoyProcess,
    processing_mode,
    start_envoy_on_free_ports,
)
from prefix_router.node.config import load_config
from prefix_router.node.life.server import Running, start
from prefix_router.protocol import WORKER_HEADER
from support.bodies import turns
from support.engines import Behaviour, FakeEngine
from support.gateway import admitted
from support.routers import QUIET, close_clients, openai_client
from support.waiting import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPLY = "one two three four"
CACHED = 7


def combinations() -> dict[str, EnvoyOptions]:
    """Every distinct filter configuration Envoy accepts, by a readable id."""
    out: dict[str, EnvoyOptions] = {}
    seen = set()
    for request, response, trailers, override, metadata in itertools.product(
        ("FULL_DUPLEX_STREAMED", "BUFFERED"),
        ("NONE", "STREAMED", "BUFFERED", "FULL_DUPLEX_STREAMED"),
        ("SEND", "SKIP"),
        (True, False),
        (True, False),
    ):
        options = EnvoyOptions(
            request_body_mode=request,
            response_body_mode=response,
            trailer_mode=trailers,
            allow_mode_override=override,
            metadata_options=metadata,
        )
        key = (tuple(processing_mode(options).items()), override, metadata)
        if key in seen:  # both sides FULL_DUPLEX_STREAMED: trailers SEND whatever was asked
            continue
        seen.add(key)
        short = {
            "FULL_DUPLEX_STREAMED": "duplex",
            "BUFFERED": "buffered",
            "STREAMED": "streamed",
            "NONE": "none",
        }
        name = f"req-{short[request]}/resp-{short[response]}/trailers-{trailers.lower()}"
        name += f"/{'override' if override else 'no-override'}/{'metadata' if metadata else 'no-metadata'}"
        out[name] = options
    return out


COMBINATIONS = combinations()


def learns(options: EnvoyOptions) -> bool:
    """Whether the picker sees the response body, so learns its usage: the gateway sends it, or the
    picker's ``mode_override`` asks for it (applied only with the request body BUFFERED and neither side
    FULL_DUPLEX_STREAMED)."""
    if options.response_body_mode != "NONE":
        return True
    return options.allow_mode_override and options.request_body_mode == "BUFFERED"


@dataclass
class Bench:
    engine: FakeEngine
    engine_running: Running
    epp: RunningEpp
    envoy: EnvoyProcess
    ports: dict[str, int]
    clients: list[AsyncOpenAI] = field(default_factory=list)

    def openai(self, name: str) -> AsyncOpenAI:
        return openai_client(f"http://127.0.0.1:{self.ports[name]}", self.clients, "unused")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def bench(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bench]:
    engine = FakeEngine("a", Behaviour(reply=REPLY, chunks=4, cached_tokens=CACHED))
    engine_running = await start(engine.app(), shutdown_timeout=0.2)
    engine.running = engine_running
    entry = {"url": engine.url, "name": "a"}
    config = load_config(env={}, overrides={**QUIET, "workers": [entry], "port": 0})
    epp = await start_epp(create_control_app(config), EppSettings(grpc_port=0))
    try:
        await admitted(epp.edge.state)
        directory: Path = tmp_path_factory.mktemp("envoy")
        options = EnvoyOptions(listeners=tuple(COMBINATIONS.values()))
        envoy = await start_envoy_on_free_ports(directory, epp.grpc_port, options)
        bound = await envoy.listener_ports()
        ports = {name: bound[f"gateway_{i}"] for i, name in enumerate(COMBINATIONS, 1)}
        bench = Bench(engine, engine_running, epp, envoy, ports)
        try:
            yield bench
        finally:
            await close_clients(bench.clients)
            await envoy.stop()
    finally:
        await epp.stop()
        await engine_running.stop()


def ended(bench: Bench) -> dict[str, float]:
    """The requests over, by the status the picker counted them with (``prefix_router_requests_total``)."""
    out: dict[str, float] = {}
    for key, value in bench.epp.edge.state.metrics.requests.values.items():
        out[key[-1]] = out.get(key[-1], 0.0) + value
    return out


@pytest.mark.parametrize("name", list(COMBINATIONS))
async def test_plain_and_streamed_through_every_mode(bench: Bench, name: str) -> None:
    options = COMBINATIONS[name]
    state = bench.epp.edge.state
    feedback = state.router.feedback["a"]
    reports, before = feedback.reports, ended(bench)
    client = bench.openai(name)
    # past one ext_proc chunk (62,000 bytes) each way the request body crosses
    prompt = "".join(f"word{i} " for i in range(12_000))
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=turns(prompt, name))
    completion = raw.parse()
    assert completion.choices[0].message.content == REPLY
    assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == CACHED
    assert raw.headers["x-engine"] == "a" and raw.headers[WORKER_HEADER] == "a"
    assert bench.engine.bodies[-1]["messages"][-1]["content"] == prompt
    stream = await client.chat.completions.create(
        model="m", messages=turns("again", name), stream=True, stream_options={"include_usage": True}
    )
    pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p or "" for p in pieces) == REPLY and len(pieces) == 4
    # both requests settled (the streams end after the answers reach the client)
    await wait_until(lambda: state.pool.total_in_flight() == 0)
    expected = reports + (2 if learns(options) else 0)
    await wait_until(lambda: feedback.reports >= expected, timeout_s=5)
    assert feedback.reports == expected
    # counted as answered, not as clients gone (with no response body: at the response headers)
    await wait_until(lambda: sum(ended(bench).values()) == sum(before.values()) + 2)
    after = ended(bench)
    assert after.get("200", 0) == before.get("200", 0) + 2, (before, after, bench.envoy.logs()[-2000:])
