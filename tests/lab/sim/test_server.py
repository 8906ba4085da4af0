"""engine-sim over real HTTP (in-process server on a free loopback port)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from prefix_router.lab.launch.engine_sim import running_engines
from prefix_router.pool.engines import promtext
from support.net import free_port

MODEL = "sim-demo"
SYSTEM = {"role": "system", "content": "You answer questions about the simulator. " * 40}


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with running_engines(1, profile="cpu-demo", time_scale=0.2) as urls:
        yield urls[0]


@pytest.fixture
async def client(url: str) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as c:
        yield c


async def metric(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


async def test_chat_non_streaming_with_official_client(client: AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model=MODEL, messages=[SYSTEM, {"role": "user", "content": "hi"}], max_tokens=12
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    assert len(reply.choices[0].message.content or "") == 12 * 4
    assert reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


async def test_cached_prefix_grows_across_turns(client: AsyncOpenAI) -> None:
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "first question"}]
    cached = []
    for turn in range(3):
        reply = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40)
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)
        assert cached[-1] < reply.usage.prompt_tokens
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"question {turn}"},
        ]
    assert cached[0] == 0 and 0 < cached[1] < cached[2]


async def test_chat_streaming_with_usage(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream please"}],
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, reasons, usage = "", [], None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reasons.append(choice.finish_reason)
        usage = chunk.usage or usage
    assert len(text) == 30 * 4
    assert reasons[-1] == "length"
    assert usage is not None and usage.completion_tokens == 30


async def test_completions_streaming_and_not(client: AsyncOpenAI) -> None:
    whole = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=9)
    assert whole.usage is not None and whole.usage.completion_tokens == 9
    stream = await client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=9, stream=True
    )
    pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
    assert "".join(pieces) == whole.choices[0].text


async def test_models_health_and_metric_names(url: str, client: AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/health") as resp:
            assert resp.status == 200
        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ):
        assert f"\n{name}{{" in text
    assert 'vllm:cache_config_info{block_size="16"' in text and 'num_gpu_blocks="4096"' in text


async def test_prefix_counters_and_reset(url: str, client: AsyncOpenAI) -> None:
    messages: Any = [SYSTEM, {"role": "user", "content": "x"}]
    for _ in range(2):
        await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    hits = await metric(url, "vllm:prefix_cache_hits_total")
    assert hits > 0 and await metric(url, "vllm:prefix_cache_queries_total") > hits
    async with aiohttp.ClientSession() as session, session.post(f"{url}/reset_prefix_cache") as resp:
        assert resp.status == 200
    again = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 0


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"model": MODEL}, "messages"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user"}], "max_tokens": -1},
            "max_tokens",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": {"a": 1}}, "prompt"),
        ("/v1/completions", {"prompt": "x"}, "model"),
    ],
)
async def test_bad_input_is_400_in_openai_format(url: str, path: str, body: Any, param: str) -> None:
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"


async def test_invalid_json_is_400(url: str) -> None:
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/completions", data=b"{") as resp:
        assert resp.status == 400
        assert "error" in await resp.json()


async def wait_running(url: str, value: float, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if await metric(url, "vllm:num_requests_running") == value:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"num_requests_running never reached {value}")


async def test_stream_disconnect_cancels_generation(url: str) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "long"}],
        "max_tokens": 20_000,
        "stream": True,
    }
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{url}/v1/chat/completions", json=body)
        assert (await resp.content.readline()).startswith(b"data: ")
        await wait_running(url, 1)
        resp.close()
    await wait_running(url, 0)


async def test_non_streaming_disconnect_cancels_generation(url: str) -> None:
    body = {"model": MODEL, "prompt": "long", "max_tokens": 20_000}

    async def send() -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/completions", json=body) as resp,
        ):
            await resp.read()

    task = asyncio.create_task(send())
    await wait_running(url, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_running(url, 0)


async def post_json(url: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def test_render_and_tokenize_give_the_ids_the_engine_prefills(url: str, client: AsyncOpenAI) -> None:
    messages: Any = [SYSTEM, {"role": "user", "content": "how many tokens?"}]
    status, rendered = await post_json(
        f"{url}/v1/chat/completions/render", {"model": MODEL, "messages": messages}
    )
    assert status == 200 and isinstance(rendered["token_ids"], list) and rendered["model"] == MODEL
    status, tokenized = await post_json(f"{url}/tokenize", {"model": MODEL, "messages": messages})
    assert status == 200 and tokenized["tokens"] == rendered["token_ids"]
    assert tokenized["count"] == len(tokenized["tokens"]) and tokenized["max_model_len"] > 0
    reply = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert reply.usage is not None and reply.usage.prompt_tokens == len(rendered["token_ids"])
    status, listed = await post_json(
        f"{url}/v1/completions/render", {"model": MODEL, "prompt": ["a b c", [1, 2]]}
    )
    assert status == 200 and [item["token_ids"] for item in listed][1] == [1, 2] and len(listed) == 2
    status, plain = await post_json(f"{url}/tokenize", {"prompt": "a b c"})
    assert status == 200 and plain["tokens"] == listed[0]["token_ids"]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        (
            "/v1/chat/completions/render",
            {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
            404,
        ),
        ("/v1/chat/completions/render", {"model": MODEL, "messages": "x"}, 400),
        ("/v1/completions/render", {"model": MODEL}, 400),
        ("/tokenize", {"model": MODEL}, 400),
    ],
)
async def test_render_errors_are_openai_errors(url: str, path: str, body: Any, status: int) -> None:
    code, answer = await post_json(url + path, body)
    assert code == status and set(answer["error"]) == {"message", "type", "param", "code"}
    async with aiohttp.ClientSession() as session, session.post(url + path, data=b"{") as resp:
        assert resp.status == 400 and "error" in await resp.json()


async def test_request_success_and_busy_time_metrics(url: str, client: AsyncOpenAI) -> None:
    assert await metric(url, "prefix_router_sim:time_scale") == 0.2
    assert await metric(url, "prefix_router_sim:busy_seconds_total") == 0.0
    await client.chat.completions.create(model=MODEL, messages=[SYSTEM], max_tokens=3)
    await client.completions.create(model=MODEL, prompt="a", max_tokens=2)
    await client.completions.create(model=MODEL, prompt="b", max_tokens=2)
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
        page = await resp.text()
    samples = promtext.parse(page, {"vllm:request_success_total"})
    assert {s.labels["finished_reason"]: s.value for s in samples} == {"length": 3}
    busy = await metric(url, "prefix_router_sim:busy_seconds_total")
    assert busy > 0


REPLAY_PORT_TAKEN = """
import asyncio, gc, socket, sys
from prefix_router.lab.sim.kv_publisher import KvEventsConfig
from prefix_router.lab.sim.server import EngineSimSettings, build_app
from prefix_router.node.life.server import start

async def main() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    events = KvEventsConfig(f"tcp://127.0.0.1:{sys.argv[1]}", f"tcp://127.0.0.1:{taken.getsockname()[1]}")
    try:
        await start(build_app(EngineSimSettings(model="m", kv_events=events)))
    except Exception as exc:
        print(type(exc).__name__)
    gc.collect()
    print("collected")

asyncio.run(main())
"""


def test_a_start_up_that_fails_closes_the_event_sockets(tmp_path: Any) -> None:
    """The replay socket's port taken: the start-up fails with the bind's error and the half-started app
    is collected. Its publisher left open, a zmq context collected with a socket still open would block
    the collecting thread for good (seen: a test worker hung 300 s after a sim engine failed to start on
    a port another process took meanwhile)."""
    script = tmp_path / "replay_port_taken.py"
    script.write_text(REPLAY_PORT_TAKEN)
    port = str(free_port())
    out = subprocess.run([sys.executable, str(script), port], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ZMQError", "collected"]
