"""Hostile request bodies through the real HTTP app (property-based, hypothesis): arbitrary JSON, wrong types,
deep nesting, invalid UTF-8, huge strings, giant token lists, thousands of messages. Every case gets either
a 4xx OpenAI error body or is routed (the engine receives the exact bytes); never a 5xx, never a crash,
and memory stays bounded."""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import threading
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefix_router.node.config import load_config
from prefix_router.node.life.server import start
from prefix_router.protocol import WORKER_HEADER
from prefix_router.proxy.run.app import create_app
from support import bodies

MAX_BODY = 24 * 1024 * 1024
FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@dataclass
class Served:
    port: int
    last_body: list[bytes]

    def send(
        self, path: str, body: bytes, conn: http.client.HTTPConnection | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        own = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        own.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = own.getresponse()
        data = resp.read()
        if conn is None:
            own.close()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def engine_app(last_body: list[bytes]) -> web.Application:
    """An engine that keeps only the last body it received (memory stays flat across examples)."""

    async def generate(request: web.Request) -> web.StreamResponse:
        last_body[:] = [await request.read()]
        return web.json_response(
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        )

    async def models(request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/{tail:.+}", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", models)
    return app


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """A router and an engine on their own event loop in a thread; the tests talk to them over HTTP."""
    loop = asyncio.new_event_loop()
    last_body: list[bytes] = []
    ready: list[Any] = []

    async def boot() -> None:
        engine = await start(engine_app(last_body), shutdown_timeout=0.2)
        overrides = {
            "workers": [{"url": engine.url, "name": "w", "models": ["m"]}],
            "limits.max_body_bytes": MAX_BODY,
        }
        router = await start(create_app(load_config(env={}, overrides=overrides)), shutdown_timeout=0.2)
        ready.extend([engine, router])

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(boot(), loop).result(30)
    try:
        yield Served(ready[1].port, last_body)
    finally:
        for running in reversed(ready):
            asyncio.run_coroutine_threadsafe(running.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def check(served: Served, path: str, body: bytes) -> int:
    """The contract: a 4xx OpenAI error, or routed with the body forwarded byte for byte."""
    status, headers, data = served.send(path, body)
    assert status < 500, (status, data[:300])
    if status >= 400:
        error = orjson.loads(data)["error"]
        assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
    else:
        assert status == 200 and headers[WORKER_HEADER] == "w"
        assert served.last_body == [body]
    return status


PATHS = st.sampled_from(["/v1/chat/completions", "/v1/completions"])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=40,
)
ROLES = st.sampled_from(["system", "user", "assistant", "tool", "developer", "function", ""]) | JSON
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio"]) | JSON},
    optional={"text": st.text(max_size=200) | JSON, "image_url": JSON},
)
CONTENT = st.text(max_size=300) | st.lists(PART, max_size=4) | JSON
MESSAGE = (
    st.fixed_dictionaries(
        {"role": ROLES}, optional={"content": CONTENT, "name": JSON, "tool_calls": JSON, "tool_call_id": JSON}
    )
    | JSON
)
MODEL = st.just("m") | JSON
TOKENS = st.lists(st.integers(min_value=-(2**70), max_value=2**70), max_size=50) | st.lists(
    st.integers(min_value=0, max_value=200_000), max_size=300
)
PROMPT = (
    st.text(max_size=500)
    | TOKENS
    | st.lists(st.text(max_size=50), max_size=5)
    | st.lists(TOKENS, max_size=3)
    | JSON
)
EXTRA = st.dictionaries(
    st.sampled_from(
        ["stream", "max_tokens", "tools", "stream_options", "cache_salt", "lora_adapter", "n", "x"]
    ),
    JSON,
    max_size=4,
)


def _dumps(body: Any) -> bytes:
    """JSON text even for integers orjson would refuse (beyond 64 bits): the wire allows them."""
    return json.dumps(body).encode()


@FUZZ
@given(path=PATHS, data=st.binary(max_size=3000))
def test_arbitrary_bytes(served: Served, path: str, data: bytes) -> None:
    check(served, path, data)


@FUZZ
@given(path=PATHS, body=JSON)
def test_arbitrary_json(served: Served, path: str, body: Any) -> None:
    check(served, path, _dumps(body))


@FUZZ
@given(model=MODEL, messages=st.lists(MESSAGE, max_size=8) | JSON, extra=EXTRA)
def test_chat_shaped_bodies(served: Served, model: Any, messages: Any, extra: dict[str, Any]) -> None:
    check(served, "/v1/chat/completions", _dumps({"model": model, "messages": messages, **extra}))


@FUZZ
@given(model=MODEL, prompt=PROMPT, extra=EXTRA)
def test_completion_shaped_bodies(served: Served, model: Any, prompt: Any, extra: dict[str, Any]) -> None:
    check(served, "/v1/completions", _dumps({"model": model, "prompt": prompt, **extra}))


@FUZZ
@given(
    junk=st.binary(min_size=1, max_size=8).filter(lambda b: not _is_utf8(b)),
    where=st.sampled_from(["content", "model", "key"]),
)
def test_invalid_utf8_inside_json(served: Served, junk: bytes, where: str) -> None:
    parts = {"content": b"hi", "model": b"m", "key": b"role"}
    parts[where] = junk
    body = (
        b'{"model": "'
        + parts["model"]
        + b'", "messages": [{"'
        + parts["key"]
        + b'": "user", "content": "'
        + parts["content"]
        + b'"}]}'
    )
    assert check(served, "/v1/chat/completions", body) == 400


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# ---------------------------------------------------------------------------------------- big and deep


def chat(content: Any, n: int = 1) -> dict[str, Any]:
    return bodies.chat(bodies.turns(content) * n)


def _nest(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


BIG_CASES = {
    "nesting 100k deep": (b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400),
    "nesting 200 deep in a part": (
        orjson.dumps(chat([{"type": "text", "text": "x", "deep": _nest(200)}])),
        200,
    ),
    "lone surrogate escape": (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', 400),
    "10 MB string": (orjson.dumps(chat("x" * 10_000_000)), 200),
    "1M token ids": (orjson.dumps({"model": "m", "prompt": list(range(1_000_000))}), 200),
    "token id out of range": (orjson.dumps({"model": "m", "prompt": [1, 2**40]}), 400),
    "1M token ids, the last out of range": (
        orjson.dumps({"model": "m", "prompt": [*range(999_999), -1]}),
        400,
    ),
    "10 MB string with a wrong model type": (orjson.dumps({**chat("x" * 10_000_000), "model": 7}), 400),
    "5000 messages": (orjson.dumps(chat("hello there", 5000)), 200),
    "100k content parts": (orjson.dumps(chat([{"type": "text", "text": "a"}] * 100_000)), 200),
    "duplicate keys": (b'{"model": "x", "model": "m", "messages": [{"role": "user", "content": "hi"}]}', 200),
    "over the body limit": (b'{"model": "m", "messages": "' + b"x" * (MAX_BODY + 10) + b'"}', 413),
}


@pytest.mark.parametrize("name", list(BIG_CASES))
def test_big_and_deep_bodies(served: Served, name: str) -> None:
    body, expected = BIG_CASES[name]
    path = "/v1/completions" if b'"prompt"' in body[:40] else "/v1/chat/completions"
    assert check(served, path, body) == expected


def test_memory_stays_bounded_under_repeated_large_requests(served: Served) -> None:
    """After a warm-up, more rounds of large bodies leave the Python heap (all of it: router, engine and
    client run in this process) where it was: nothing is retained per request."""
    bodies = [
        ("/v1/completions", orjson.dumps({"model": "m", "prompt": list(range(50_000))})),
        ("/v1/chat/completions", orjson.dumps(chat("y" * 500_000))),
        ("/v1/chat/completions", orjson.dumps(chat("hello there", 1000))),
    ]
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)

    def rounds(n: int) -> int:
        for _ in range(n):
            for path, body in bodies:
                assert served.send(path, body, conn)[0] == 200
        served.last_body.clear()
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        before = rounds(2)
        after = rounds(4)
    finally:
        tracemalloc.stop()
        conn.close()
    assert after - before < 4 * 1024 * 1024, f"the heap grew {(after - before) / 2**20:.1f} MiB over 4 rounds"
