"""The official openai client through a real Envoy -> prefix-router epp -> test engines: the data path
is Envoy's, the choice the picker's (``x-gateway-destination-endpoint``), the learning the routing core's."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
import zmq.asyncio
from openai import APIStatusError

from prefix_router.events import BlockStored
from prefix_router.lab.launch.envoy import DESTINATION_HEADER, EnvoyOptions
from prefix_router.protocol import MATCH_HEADER, WORKER_HEADER
from support.bodies import turns
from support.gateway import Gateway, Gateways
from support.kv_events import FakePublisher, free_port
from support.waiting import wait_until

SYSTEM = "You are a careful assistant who answers in one short sentence. " * 12


def chat(user: str, system: str = SYSTEM) -> list[Any]:
    return turns(user, system)


WITHOUT_RESPONSE_HEADERS = {  # decision headers, response headers sent to the picker, the gateway
    "headers sent": (True, True, EnvoyOptions()),
    # the picker's override (applied: the request body BUFFERED) asks for them all the same
    "no decision headers": (False, True, EnvoyOptions(request_body_mode="BUFFERED")),
    # the gateway's config skips them: the status and the endpoint come as attributes with the body
    "skipped by the gateway": (False, False, EnvoyOptions(response_header_mode="SKIP")),
}


@pytest.mark.parametrize("case", list(WITHOUT_RESPONSE_HEADERS))
async def test_plain_streamed_and_completions(fake_engine: Any, gateways: Gateways, case: str) -> None:
    """Without the response headers the status and the endpoint come with the body (attributes), and the
    feedback is the same."""
    decision_headers, headers_sent, options = WITHOUT_RESPONSE_HEADERS[case]
    engine = await fake_engine("a", reply="one two three four", chunks=4, cached_tokens=7)
    settings = {"tenants.decision_headers": decision_headers}
    gateway = await gateways.start(engine, settings=settings, envoy=options)
    client = gateway.openai()
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=chat("hi"))
    completion = raw.parse()
    assert completion.choices[0].message.content == "one two three four"
    assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 7
    assert raw.headers["server"] == "envoy" and raw.headers["x-engine"] == "a"
    assert raw.headers.get(WORKER_HEADER) == ("a" if decision_headers else None)
    stream = await client.chat.completions.create(
        model="m", messages=chat("again"), stream=True, stream_options={"include_usage": True}
    )
    pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p or "" for p in pieces) == "one two three four" and len(pieces) == 4
    whole = await client.completions.create(model="m", prompt="once upon a time " * 20)
    assert whole.choices[0].text == "one two three four"
    # the engine's usage reached the routing core's feedback, through Envoy's response phase
    stats = gateway.state.router.feedback["a"]
    assert stats.reports == 3 and stats.reported_tokens == 21
    assert gateway.state.pool.total_in_flight() == 0
    assert gateway.edge.messages["response_headers"] == (3 if headers_sent else 0)
    assert gateway.edge.messages["response_body"] >= 3


async def test_large_body_crosses_byte_for_byte(fake_engine: Any, gateways: Gateways) -> None:
    engine = await fake_engine("a")
    gateway = await gateways.start(engine)
    text = "".join(f"token{i} " for i in range(90_000))  # ~650 KB: many ext_proc chunks each way
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}], "x": [1, 2.5]})
    async with aiohttp.ClientSession() as http:
        resp = await http.post(gateway.url + "/v1/chat/completions", data=body)
        assert resp.status == 200, await resp.text()
        await resp.read()
    assert len(body) > 600_000 and engine.generations[-1].body == body


async def test_shared_prefix_sticks_and_unrelated_prompts_spread(
    fake_engine: Any, gateways: Gateways
) -> None:
    a = await fake_engine("a", delay_s=0.05)
    b = await fake_engine("b", delay_s=0.05)
    gateway = await gateways.start(a, b)
    client = gateway.openai()
    first = await client.chat.completions.with_raw_response.create(model="m", messages=chat("q0"))
    owner = first.headers[WORKER_HEADER]
    for i in range(1, 6):
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=chat(f"q{i}"))
        assert raw.headers[WORKER_HEADER] == owner
        assert int(raw.headers[MATCH_HEADER]) > 0
    # load spread: concurrent requests with nothing shared go to both engines
    prompts = [f"{i} unrelated topic number {i} " * 30 for i in range(16)]
    await asyncio.gather(
        *(client.chat.completions.create(model="m", messages=chat("x", system=p)) for p in prompts)
    )
    assert len(a.generations) >= 4 and len(b.generations) >= 4


async def test_subset_hint_is_honoured(fake_engine: Any, gateways: Gateways) -> None:
    a = await fake_engine("a")
    b = await fake_engine("b")
    subset = [address_of_engine(b)]
    gateway = await gateways.start(a, b, envoy=EnvoyOptions(subset=subset))
    client = gateway.openai()
    for i in range(12):  # nothing shared: without the hint, about half would go to a
        messages = chat("x", system=f"{i} unrelated topic {i} " * 30)
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages)
        assert raw.headers[WORKER_HEADER] == "b"
    assert not a.generations


async def test_subset_without_an_eligible_endpoint_is_503(fake_engine: Any, gateways: Gateways) -> None:
    a = await fake_engine("a")
    gateway = await gateways.start(a, envoy=EnvoyOptions(subset=["127.0.0.1:1"]))
    with pytest.raises(APIStatusError) as caught:
        await gateway.openai().chat.completions.create(model="m", messages=chat("x"))
    assert caught.value.status_code == 503
    assert caught.value.body is not None and "subset" in str(caught.value.body)
    assert not a.generations


def address_of_engine(engine: Any) -> str:
    return engine.url.removeprefix("http://")


async def error_of(gateway: Any, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(gateway.url + "/v1/chat/completions", data=body, headers=headers or {})
        return resp.status, orjson.loads(await resp.read())


async def test_protocol_error_answers(fake_engine: Any, gateways: Gateways) -> None:
    engine = await fake_engine("a")
    gateway = await gateways.start(engine, settings={"limits.max_body_bytes": 100_000})
    status, body = await error_of(gateway, b"{not json")
    assert status == 400 and body["error"]["code"] == "invalid_json"
    status, body = await error_of(gateway, orjson.dumps({"model": "nope", "messages": chat("x")}))
    assert status == 404 and body["error"]["code"] == "model_not_found"
    big = orjson.dumps({"model": "m", "messages": chat("x" * 200_000)})
    status, body = await error_of(gateway, big)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert not engine.generations


async def test_client_key_checked_by_the_picker(fake_engine: Any, gateways: Gateways) -> None:
    engine = await fake_engine("a")
    gateway = await gateways.start(engine, settings={"auth.api_keys": ["k1"]})
    with pytest.raises(APIStatusError) as caught:
        await gateway.openai("wrong").chat.completions.create(model="m", messages=chat("x"))
    assert caught.value.status_code == 401
    ok = await gateway.openai("k1").chat.completions.create(model="m", messages=chat("x"))
    assert ok.choices[0].message.content
    assert "authorization" not in {k.lower() for k in engine.generations[-1].headers}


async def test_shedding_is_429_and_no_worker_is_503(fake_engine: Any, gateways: Gateways) -> None:
    engine = await fake_engine("a", hang=True)
    gateway = await gateways.start(engine, settings={"limits.max_in_flight_per_worker": 1})
    client = gateway.openai()
    hanging = asyncio.create_task(client.chat.completions.create(model="m", messages=chat("1")))
    await wait_until(lambda: gateway.state.pool.total_in_flight() >= 1)
    with pytest.raises(APIStatusError) as caught:
        await client.chat.completions.create(model="m", messages=chat("2"))
    assert caught.value.status_code == 429 and caught.value.response.headers["retry-after"]
    hanging.cancel()
    # the client left: Envoy ends the stream, the flight ends
    await wait_until(lambda: gateway.state.pool.total_in_flight() == 0)
    gateway.state.pool.report(gateway.state.pool.require("a"), False, "down")
    gateway.state.pool.report(gateway.state.pool.require("a"), False, "down")
    gateway.state.pool.report(gateway.state.pool.require("a"), False, "down")
    with pytest.raises(APIStatusError) as caught:
        await client.chat.completions.create(model="m", messages=chat("3"))
    assert caught.value.status_code == 503
    assert caught.value.body is not None and "no healthy worker" in str(caught.value.body)


async def test_client_gone_mid_stream_ends_the_flight(fake_engine: Any, gateways: Gateways) -> None:
    engine = await fake_engine("a", reply="x" * 40, chunks=40, chunk_delay_s=0.05)
    gateway = await gateways.start(engine)
    stream = await gateway.openai().chat.completions.create(model="m", messages=chat("x"), stream=True)
    async for _ in stream:
        break
    await stream.close()
    await wait_until(lambda: gateway.state.pool.total_in_flight() == 0)
    await asyncio.wait_for(engine.cancelled.wait(), 5)  # Envoy reset the engine's stream too


async def test_killed_engine_is_ejected_within_the_health_interval(
    fake_engine: Any, gateways: Gateways
) -> None:
    a = await fake_engine("a")
    b = await fake_engine("b")
    interval = 0.3  # a dead engine's probe fails at once (refused); a live one's has a second
    settings = {"health.interval_s": interval, "health.timeout_s": 1.0, "health.fail_threshold": 1}
    gateway = await gateways.start(a, b, settings=settings)
    client = gateway.openai()
    assert a.running is not None
    await a.running.stop()
    # ejected within the health interval (and a second of slack for a loaded machine)
    await wait_until(lambda: not gateway.state.pool.require("a").available, timeout_s=interval + 1.0)
    for i in range(8):
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=chat(f"k{i}"))
        assert raw.headers[WORKER_HEADER] == "b"


@pytest.mark.parametrize("case", list(WITHOUT_RESPONSE_HEADERS))
async def test_connect_failure_reported_by_envoy_ejects(
    fake_engine: Any, gateways: Gateways, case: str
) -> None:
    """Between probes, the gateway's own connect failure (``response.flags`` UF) is a passive check
    (read from the response headers, or from the body's attributes when the headers are skipped)."""
    decision_headers, _, options = WITHOUT_RESPONSE_HEADERS[case]
    a = await fake_engine("a")
    settings = {"health.fail_threshold": 1, "tenants.decision_headers": decision_headers}
    gateway = await gateways.start(a, settings=settings, envoy=options)
    assert a.running is not None
    await a.running.stop()
    with pytest.raises(APIStatusError) as caught:
        await gateway.openai().chat.completions.create(model="m", messages=chat("x"))
    assert caught.value.status_code == 503
    assert not gateway.state.pool.require("a").available
    assert gateway.state.pool.require("a").health.last_error == "HTTP 503"


async def test_epp_down_fails_closed_with_503(fake_engine: Any, gateways: Gateways) -> None:
    engine = await fake_engine("a")
    gateway = await gateways.start(engine)
    await gateway.stop_epp()
    with pytest.raises(APIStatusError) as caught:
        await gateway.openai().chat.completions.create(model="m", messages=chat("x"))
    assert caught.value.status_code == 503
    assert not engine.generations


async def test_epp_down_fails_open_to_the_fallback(fake_engine: Any, gateways: Gateways) -> None:
    """Fail-open with the request body BUFFERED: the gateway learns the picker is gone at the headers.
    With FULL_DUPLEX_STREAMED, Envoy 1.40 fails open only when the gRPC error beats the body to the
    picker; once the body is streamed it answers 503 (its log: "Sending a body chunk ... Sending local
    reply with status code 503"), a race seen in about 1 of 6 runs here (docs/epp.md)."""
    a = await fake_engine("a")
    b = await fake_engine("b")
    options = EnvoyOptions(
        fail_open=True, fallback_endpoint=address_of_engine(b), request_body_mode="BUFFERED"
    )
    gateway = await gateways.start(a, b, envoy=options)
    first = await gateway.openai().chat.completions.with_raw_response.create(model="m", messages=chat("x"))
    assert first.headers[WORKER_HEADER] in ("a", "b")  # the picker answered
    await gateway.stop_epp()
    raw = await gateway.openai().chat.completions.with_raw_response.create(model="m", messages=chat("y"))
    assert raw.headers["x-engine"] == "b" and WORKER_HEADER not in raw.headers


async def test_streams_beyond_max_streams_are_refused(fake_engine: Any, gateways: Gateways) -> None:
    engine = await fake_engine("a", hang=True)
    gateway = await gateways.start(engine, epp={"max_streams": 1})
    client = gateway.openai()
    hanging = asyncio.create_task(client.chat.completions.create(model="m", messages=chat("1")))
    # the first request at the engine (the picker counts it in flight before the gateway forwards it)
    await wait_until(lambda: gateway.state.pool.total_in_flight() >= 1 and len(engine.generations) == 1)
    assert gateway.epp is not None and gateway.epp.edge.streams == 1
    with pytest.raises(APIStatusError) as caught:  # gRPC's RESOURCE_EXHAUSTED: the gateway fails closed
        await client.chat.completions.create(model="m", messages=chat("2"))
    assert caught.value.status_code == 503 and len(engine.generations) == 1
    metrics = gateway.state.metrics.render().decode()
    assert "prefix_router_epp_streams 1.0" in metrics
    hanging.cancel()


@pytest.mark.parametrize("salted", [True, False])
async def test_the_cache_salt_keeps_tenants_engine_caches_apart(
    serve_app: Any, gateways: Gateways, salted: bool
) -> None:
    """``tenants.cache_salt`` through the gateway: the picker salts the body (and its length) as ``serve``
    does, so tenant B's replay of tenant A's prompt finds nothing of A's in the (simulated vLLM) engine's
    cache; the control without salt finds it."""
    from prefix_router.lab.sim.server import EngineSimSettings, build_app

    engine = await serve_app(build_app(EngineSimSettings(model="m", time_scale=0.01)))
    settings = {"tenants.cache_salt": salted, "auth.api_keys": ["key-tenant-a", "key-tenant-b"]}
    gateway = await gateways.start({"url": engine.url, "name": "sim"}, settings=settings)
    assert gateway.state.pool.require("sim").adapter.name == "vllm"  # type: ignore[union-attr]

    async def cached(key: str) -> int:
        reply = await gateway.openai(key).chat.completions.create(
            model="m", messages=chat("first"), max_tokens=2
        )
        assert reply.usage is not None
        details = reply.usage.prompt_tokens_details
        return (details.cached_tokens or 0) if details is not None else 0

    await cached("key-tenant-a")
    assert await cached("key-tenant-a") > 0  # A's own cache serves A
    if salted:
        assert await cached("key-tenant-b") == 0
    else:
        assert await cached("key-tenant-b") > 0


async def test_a_buffered_request_body_gets_the_choice_with_its_answer(
    fake_engine: Any, gateways: Gateways
) -> None:
    """An Envoy sending request bodies BUFFERED (``protocol_config``): headers answered at once, the
    destination with the body's answer; plain, streamed and large bodies still cross intact."""
    a = await fake_engine("a", reply="one two three", chunks=3, cached_tokens=2)
    b = await fake_engine("b", reply="one two three", chunks=3, cached_tokens=2)
    gateway = await gateways.start(a, b, envoy=EnvoyOptions(request_body_mode="BUFFERED"))
    client = gateway.openai()
    first = await client.chat.completions.with_raw_response.create(model="m", messages=chat("q0"))
    owner = first.headers[WORKER_HEADER]
    for i in range(1, 4):
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=chat(f"q{i}"))
        assert raw.headers[WORKER_HEADER] == owner and int(raw.headers[MATCH_HEADER]) > 0
    stream = await client.chat.completions.create(model="m", messages=chat("s"), stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "one two three"
    text = "".join(f"token{i} " for i in range(90_000))
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
    async with aiohttp.ClientSession() as http:
        resp = await http.post(gateway.url + "/v1/chat/completions", data=body)
        assert resp.status == 200, await resp.text()
        await resp.read()
    assert body in (a.generations[-1].body, b.generations[-1].body)
    assert sum(gateway.state.router.feedback[n].reports for n in ("a", "b")) == 5


async def test_a_large_whole_response_is_learned_from_all_its_chunks(
    fake_engine: Any, gateways: Gateways
) -> None:
    """A whole (not streamed) answer passes chunk by chunk (no gateway buffer limit); its usage, at the
    end, is read once the last chunk is in."""
    engine = await fake_engine("a", reply="r" * 300_000, cached_tokens=3)
    gateway = await gateways.start(engine)
    reply = await gateway.openai().chat.completions.create(model="m", messages=chat("x"))
    assert reply.choices[0].message.content == "r" * 300_000
    assert gateway.state.router.feedback["a"].reports == 1


async def dead_owner(
    fake_engine: Any, gateways: Gateways, retries: int, system: str = SYSTEM
) -> tuple[Any, Any, list[Any]]:
    """Three engines behind an override_host cluster, the picker listing all of them (``--fallbacks 2``);
    the engine that owns the shared prefix (``system``) is then stopped. The picker still counts it
    healthy (its probes are an hour apart), so it stays the first choice for that prefix."""
    engines = [
        await fake_engine(name, reply="one two three", chunks=3, cached_tokens=2) for name in ("a", "b", "c")
    ]
    options = EnvoyOptions(endpoints=[address_of_engine(e) for e in engines], retries=retries)
    gateway = await gateways.start(*engines, epp={"fallbacks": 2}, envoy=options)
    client = gateway.openai()
    first = await client.chat.completions.with_raw_response.create(model="m", messages=chat("q0", system))
    owner = next(e for e in engines if e.name == first.headers[WORKER_HEADER])
    assert owner.running is not None
    await owner.running.stop()
    return gateway, owner, engines


async def envoy_stats(gateway: Gateway, prefix: str) -> dict[str, int]:
    """Envoy's counters under ``prefix`` (its admin ``/stats``), the prefix removed."""
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{gateway.envoy.ports.admin}/stats"
        async with http.get(url, params={"filter": f"^{prefix}"}) as resp:
            text = await resp.text()
    pairs = (line.split(": ", 1) for line in text.splitlines() if ": " in line)
    return {k.removeprefix(prefix): int(v) for k, v in pairs if v.isdigit()}


def listed_by_the_picker(engine: Any) -> list[str]:
    """The picker's ordered list, as the engine that served the last request received it."""
    return str(engine.generations[-1].headers[DESTINATION_HEADER]).split(",")


LARGE = "".join(f"token{i} " for i in range(90_000))  # ~650 KB: many ext_proc chunks, kept for a retry


async def send(gateway: Gateway, kind: str) -> tuple[str, str]:
    """One request of ``kind`` (plain, streamed, large: a ``LARGE`` shared prefix) sharing the first
    request's prefix: the engine that answered it (``x-engine``) and the answer's text."""
    client = gateway.openai()
    if kind == "streamed":
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=chat("q1"), stream=True, stream_options={"include_usage": True}
        )
        text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
        return raw.headers["x-engine"], text
    if kind == "plain":
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=chat("q1"))
        return raw.headers["x-engine"], str(raw.parse().choices[0].message.content)
    body = orjson.dumps({"model": "m", "messages": chat("q1", LARGE)})
    async with aiohttp.ClientSession() as http:
        resp = await http.post(gateway.url + "/v1/chat/completions", data=body)
        assert resp.status == 200, await resp.text()
        reply = orjson.loads(await resp.read())
    return resp.headers["x-engine"], reply["choices"][0]["message"]["content"]


@pytest.mark.parametrize("kind", ["plain", "streamed", "large"])
async def test_envoy_falls_back_to_the_next_endpoint_of_the_pickers_list(
    fake_engine: Any, gateways: Gateways, kind: str
) -> None:
    """The ordered fallback list through Envoy's override_host policy: the first choice refuses
    connections, Envoy's retry lands on the list's second entry, and the picker moves the flight there
    (the served endpoint Envoy reports in ``envoy.lb``) and learns the answer's usage on it."""
    system = LARGE if kind == "large" else SYSTEM
    gateway, owner, engines = await dead_owner(fake_engine, gateways, retries=2, system=system)
    name, text = await send(gateway, kind)
    server = next(e for e in engines if e.name == name)
    listed = listed_by_the_picker(server)
    assert listed[0] == address_of_engine(owner) and len(listed) == 3
    assert listed[1] == address_of_engine(server) and text == "one two three"
    if kind == "large":
        assert len(server.generations[-1].body) > 600_000  # arrived whole on the second attempt
    # Envoy's own count: refused once, retried once
    stats = await envoy_stats(gateway, "cluster.endpoints.")
    assert stats["upstream_cx_connect_fail"] == 1 and stats["upstream_rq_retry"] == 1
    # the flight moved to the endpoint that served it: the usage learned there, the flight ended there
    # (settled when the picker sees the body's end, which may come after the client's last event)
    await wait_until(lambda: gateway.state.router.feedback[server.name].reports == 1)
    assert gateway.state.router.feedback[owner.name].reports == 1  # the first request, before the stop
    await wait_until(lambda: gateway.state.pool.total_in_flight() == 0)


async def test_without_retries_the_list_is_not_followed(fake_engine: Any, gateways: Gateways) -> None:
    """The control: the same gateway without Envoy retries answers the dead first choice's 503."""
    gateway, _, engines = await dead_owner(fake_engine, gateways, retries=0)
    with pytest.raises(APIStatusError) as caught:
        await gateway.openai().chat.completions.create(model="m", messages=chat("q1"))
    assert caught.value.status_code == 503
    assert sum(len(e.generations) for e in engines) == 1  # only the first request, before the stop


def fake_ids(body: dict[str, Any]) -> list[int]:
    """The stand-in engine's tokenizer: one id per byte of the messages' contents."""
    return list("".join(str(m["content"]) for m in body["messages"]).encode())


async def decided(gateway: Gateway, body: dict[str, Any]) -> tuple[str, int]:
    """The worker the picker chose for ``body`` and the cached tokens it predicted there."""
    raw = await gateway.openai().chat.completions.with_raw_response.create(**body)
    return raw.headers[WORKER_HEADER], int(raw.headers[MATCH_HEADER])


async def test_precise_mode_keys_rendered_by_the_event_fed_engine(
    fake_engine: Any, gateways: Gateways
) -> None:
    """Precise mode as ``serve`` runs it: without a local template, the event-fed engine renders the
    request's token ids (``routing.events.render``); its KV events then decide the choice and the
    prediction, and a second request finds the render cached."""
    block = 16
    a = await fake_engine("a", render_ids=fake_ids)
    b = await fake_engine("b", render_ids=fake_ids)
    port = free_port()
    events = {"endpoint": f"tcp://127.0.0.1:{port}", "bind": True, "topic": "kv"}
    entries: list[dict[str, Any]] = [
        {"url": a.url, "name": "a", "models": ["m"]},
        {"url": b.url, "name": "b", "models": ["m"], "kv_events": events},
    ]
    gateway = await gateways.start(
        *entries, settings={"routing.keys.mode": "events", "routing.events.block_tokens": block}
    )
    state = gateway.state
    context = zmq.asyncio.Context()
    publisher = FakePublisher(context, f"tcp://127.0.0.1:{port}", bind=False)
    try:
        subscriber = state.events.subscribers["b"]  # type: ignore[union-attr]
        for _ in range(250):  # the subscriber connects when it will: publish until it has heard one
            await publisher.publish([])
            if subscriber.stats.decoded:
                break
            await asyncio.sleep(0.02)
        assert subscriber.stats.decoded
        body = {"model": "m", "messages": chat("Where is parcel 8?")}
        ids = fake_ids(body)
        held = len(ids) // block * block
        stored = BlockStored(tuple(range(1, held // block + 1)), None, tuple(ids[:held]), block)
        await publisher.publish([stored])
        await wait_until(lambda: state.router.precise.held_blocks("b") == held // block)
        assert await decided(gateway, body) == ("b", held)
        assert await decided(gateway, body) == ("b", held)
        renders = state.renders
        assert renders is not None and (renders.stats.requests, renders.stats.cached) == (1, 1)
        assert len([s for s in b.seen if s.path.endswith("/render")]) == 1 and not a.generations
    finally:
        await publisher.close()
        context.term()


async def test_the_control_listener_serves_probes_metrics_and_the_admin_api(
    fake_engine: Any, gateways: Gateways
) -> None:
    """The picker's HTTP listener, as ``serve``'s: probes, ``/metrics`` with the picker's series and the
    routing core's, and the admin API behind ``auth.admin_token`` (a worker drained there gets no more
    requests through the gateway)."""
    a = await fake_engine("a")
    b = await fake_engine("b")
    token = "admin-token-for-epp-tests"
    gateway = await gateways.start(a, b, settings={"auth.admin_token": token})
    await gateway.openai().chat.completions.create(model="m", messages=chat("x"))
    assert gateway.epp is not None
    control = gateway.epp.http.url
    admin = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http:
        for path in ("/health", "/ready"):
            async with http.get(control + path) as resp:
                assert resp.status == 200, path
        async with http.get(control + "/metrics") as resp:
            metrics = await resp.text()
        assert 'prefix_router_epp_messages_total{kind="request_headers"} 1.0' in metrics
        assert "prefix_router_requests_total" in metrics
        async with http.get(control + "/admin/workers") as resp:
            assert resp.status == 401
        async with http.post(control + "/admin/workers/a/drain", headers=admin) as resp:
            assert resp.status == 200, await resp.text()
    for i in range(6):
        raw = await gateway.openai().chat.completions.with_raw_response.create(
            model="m", messages=chat("y", system=f"{i} unrelated topic {i} " * 30)
        )
        assert raw.headers[WORKER_HEADER] == "b"
    async with aiohttp.ClientSession() as http:  # the dashboard, as serve's: behind the same token
        async with http.get(control + "/dashboard") as resp:
            assert resp.status == 401 and 'name="token"' in await resp.text()
        async with http.get(control + "/dashboard/data", headers=admin) as resp:
            doc = await resp.json()
    assert {w["name"]: w["draining"] for w in doc["workers"]} == {"a": True, "b": False}
    assert doc["decisions_total"] == 7 and doc["decisions"][-1]["worker"] == "b"
