"""benchmarks/floor_servers: the floor benchmark's forward-only proxies carry requests and answers intact,
through the official ``openai`` client, non-streamed and streamed, keep-alive and concurrent, large
bodies included; a worker that is down is a 502, not a hang.

The granian floor runs granian from the dev dependencies (a measuring instrument, never the router's
server)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from prefix_router.lab.bench.overhead import processes
from support.net import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "floor_servers"))
from floor_common import FLOORS, floor_argv


def echo_of(body: dict[str, Any]) -> str:
    """What the echo engine answers: the last message's length and its ends (the body arrived whole)."""
    text = body["messages"][-1]["content"]
    return f"{len(text)}:{text[:20]}...{text[-20:]}"


async def completions(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    reply = echo_of(body)
    if not body.get("stream"):
        choice = {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
        answer = {"id": "e", "object": "chat.completion", "created": 0, "model": "echo", "choices": [choice]}
        return web.json_response(answer)
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    for i in range(0, len(reply), 7):  # several events, several chunks
        delta = {"index": 0, "delta": {"content": reply[i : i + 7]}, "finish_reason": None}
        event = {"id": "e", "object": "chat.completion.chunk", "model": "echo", "choices": [delta]}
        await out.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await asyncio.sleep(0)
    await out.write(b"data: [DONE]\n\n")
    await out.write_eof()
    return out


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def wait_port(port: int, pid: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the floor server exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture
def start_floor() -> Iterator[Any]:
    with processes() as spawn:  # the benchmark's own spawner: every server stopped at the end

        def start(name: str, upstream: str) -> str:
            port = free_port()
            pid = spawn(*floor_argv(name, port, upstream))  # the command lines floor.py runs
            wait_port(port, pid)
            return f"http://127.0.0.1:{port}/v1"

        yield start


def client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=10.0)


def prompt(n: int, chars: int) -> str:
    return (f"prompt {n} " + "abcdefghij" * (chars // 10 + 1))[:chars] + f" end {n}"


@pytest.mark.parametrize("name", FLOORS)
async def test_a_floor_relays_requests_and_answers_intact(name: str, engine: str, start_floor: Any) -> None:
    api = client(start_floor(name, engine))
    try:
        for chars in (100, 600_000):  # a large body arrives in several reads
            text = prompt(chars, chars)
            messages: Any = [{"role": "user", "content": text}]
            answer = await api.chat.completions.create(model="echo", messages=messages)
            assert answer.choices[0].message.content == echo_of({"messages": messages})
            stream = await api.chat.completions.create(model="echo", messages=messages, stream=True)
            pieces = [chunk.choices[0].delta.content or "" async for chunk in stream]
            assert len(pieces) > 3
            assert "".join(pieces) == echo_of({"messages": messages})

        async def one(n: int) -> None:
            messages: Any = [{"role": "user", "content": prompt(n, 3_000)}]
            answer = await api.chat.completions.create(model="echo", messages=messages)
            assert answer.choices[0].message.content == echo_of({"messages": messages})

        await asyncio.gather(*(one(n) for n in range(20)))  # concurrent, on kept-alive connections
    finally:
        await api.close()


@pytest.mark.parametrize("name", FLOORS)
async def test_a_floor_answers_502_when_its_worker_is_down(name: str, start_floor: Any) -> None:
    api = client(start_floor(name, f"http://127.0.0.1:{free_port()}"))
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            await api.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
        assert caught.value.status_code == 502
    finally:
        await api.close()
