"""A small fake OpenAI-compatible server over real HTTP (aiohttp on a free loopback port).

It streams SSE like an engine, reports ``cached_tokens`` from a toy prefix cache (characters / 4 of the
longest prefix shared with any earlier prompt), names itself in ``x-prefix-router-worker``, answers 500
with an OpenAI error body to prompts containing ``FAIL``, and records every body and header it received.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from prefix_router.protocol import WORKER_HEADER


@dataclass
class FakeEngine:
    name: str = "fake-0"
    delay_s: float = 0.0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    resets: int = 0
    url: str = ""
    in_flight: int = 0
    max_in_flight: int = 0
    worker_header: bool = True

    def prompt_of(self, body: dict[str, Any]) -> str:
        if "prompt" in body:
            return str(body["prompt"])
        return json.dumps(body["messages"], sort_keys=True)[:-1]

    def cached_chars(self, prompt: str) -> int:
        best = 0
        for seen in self.prompts:
            n = 0
            for a, b in zip(seen, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best


def _chunk(chat: bool, text: str | None, usage: dict[str, Any] | None = None) -> bytes:
    if chat:
        choices = [] if text is None else [{"index": 0, "delta": {"content": text}, "finish_reason": None}]
        obj = "chat.completion.chunk"
    else:
        choices = [] if text is None else [{"index": 0, "text": text, "finish_reason": None}]
        obj = "text_completion"
    payload = {"id": "x", "object": obj, "created": 0, "model": "m", "choices": choices, "usage": usage}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def _complete(request: web.Request, engine: FakeEngine, chat: bool) -> web.StreamResponse:
    body = await request.json()
    engine.bodies.append(body)
    engine.headers.append(dict(request.headers))
    prompt = engine.prompt_of(body)
    if "FAIL" in prompt:
        error = {"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}
        return web.json_response(error, status=500)
    engine.in_flight += 1
    engine.max_in_flight = max(engine.max_in_flight, engine.in_flight)
    try:
        return await _stream(request, engine, body, prompt, chat)
    finally:
        engine.in_flight -= 1


async def _stream(
    request: web.Request, engine: FakeEngine, body: dict[str, Any], prompt: str, chat: bool
) -> web.StreamResponse:
    cached = engine.cached_chars(prompt) // 4
    engine.prompts.append(prompt)
    headers = {"Content-Type": "text/event-stream"}
    if engine.worker_header:
        headers[WORKER_HEADER] = engine.name
    resp = web.StreamResponse(headers=headers)
    await resp.prepare(request)
    await asyncio.sleep(engine.delay_s)
    n = int(body.get("max_tokens") or 4)
    for i in range(n):
        await resp.write(_chunk(chat, f"w{i} "))
    usage = {
        "prompt_tokens": max(1, len(prompt) // 4),
        "completion_tokens": n,
        "total_tokens": n + len(prompt) // 4,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    await resp.write(_chunk(chat, None, usage))
    await resp.write(b"data: [DONE]\n\n")
    return resp


def make_app(engine: FakeEngine) -> web.Application:
    app = web.Application()

    async def chat(request: web.Request) -> web.StreamResponse:
        return await _complete(request, engine, chat=True)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await _complete(request, engine, chat=False)

    async def reset(request: web.Request) -> web.Response:
        engine.prompts.clear()
        engine.resets += 1
        return web.json_response({"ok": True})

    async def metrics(request: web.Request) -> web.Response:
        text = f"vllm:request_success_total {len(engine.prompts)}\n"
        return web.Response(text=text, content_type="text/plain")

    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/reset_prefix_cache", reset)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", _ok)
    app.router.add_get("/v1/models", _models)
    return app


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _models(request: web.Request) -> web.Response:
    return web.json_response(
        {"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "x"}]}
    )


async def start_fake(engine: FakeEngine) -> web.AppRunner:
    runner = web.AppRunner(make_app(engine))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    engine.url = f"http://127.0.0.1:{port}"
    return runner


@pytest.fixture
async def fake_pair() -> AsyncIterator[list[FakeEngine]]:
    """Two fake engines, for the harness (router in front)."""
    engines = [FakeEngine(name=f"fake-{i}") for i in range(2)]
    runners = [await start_fake(e) for e in engines]
    try:
        yield engines
    finally:
        for runner in runners:
            await runner.cleanup()


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeEngine]:
    engine = FakeEngine()
    runner = await start_fake(engine)
    try:
        yield engine
    finally:
        await runner.cleanup()
