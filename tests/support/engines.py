"""A scriptable fake OpenAI-compatible engine (chat and completions, streamed or not, models, health,
metrics, prefix-cache reset), served over real HTTP by the ``fake_engine`` fixture; ``Behaviour``'s flags
choose what it does (``BENCH_ENGINE``: the engine the lab's benchmark tests drive)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from prefix_router.node.life.server import Running
from prefix_router.protocol import WORKER_HEADER


@dataclass
class Behaviour:
    """What the fake engine does; tests change it while it runs."""

    models: list[str] = field(default_factory=lambda: ["m"])
    reply: str = "hello from the fake engine"
    cached_tokens: int | None = None
    # usage.prompt_tokens; None: a quarter of the request body's bytes, never below cached_tokens
    prompt_tokens: int | None = None
    # set: usage.prompt_tokens counts the prompt as rendered by a ChatML-like template (``rendered_tokens``)
    chars_per_token: float | None = None
    fail_next: int = 0  # the next N generation requests answer 500
    status: int = 200  # status of generation requests (when not failing)
    hang: bool = False  # accept generation requests and never answer
    delay_s: float = 0.0  # before answering generation requests
    chunks: int = 3  # stream pieces of the reply
    chunk_delay_s: float = 0.0
    die_after_chunks: int | None = None  # streams: drop the connection after this many chunks
    health_status: int = 200  # 404: no /health, so probes fall back to /v1/models
    models_status: int = 200
    metrics_text: str | None = None  # None: no /metrics (404) unless success_metric is set
    success_metric: str | None = None  # set: /metrics is "<success_metric> <generations answered>"
    # cached_tokens from a toy prefix cache: characters / 4 of the longest prefix the prompt shares with a
    # prompt answered since the last POST /reset_prefix_cache (which answers 404 when off)
    toy_cache: bool = False
    worker_header: bool = False  # name itself in the router's worker header, as the router does
    fail_marker: str | None = None  # prompts containing it answer 500 with an OpenAI error ("boom")
    # the reply is max_tokens (default 4) words "w0 w1 ...", one a chunk; completion_tokens = max_tokens
    words_per_max_tokens: bool = False
    # /v1/chat/completions/render: ``{"token_ids": render_ids(body)}`` with ``render_status`` (None: 404)
    render_ids: Callable[[dict[str, Any]], list[int]] | None = None
    render_status: int = 200
    # a prefill engine of vLLM's NIXL-style connectors: a request with ``kv_transfer_params.do_remote_decode``
    # is answered with these ``kv_transfer_params`` (where its KV cache waits for the decode)
    kv_transfer_params: dict[str, Any] | None = None


# the engine the lab's benchmark tests (tests/lab/bench) drive
BENCH_ENGINE: dict[str, Any] = {
    "models": ["fake-model"],
    "toy_cache": True,
    "worker_header": True,
    "fail_marker": "FAIL",
    "words_per_max_tokens": True,
    "success_metric": "vllm:request_success_total",
}


@dataclass
class Seen:
    path: str
    method: str
    headers: dict[str, str]
    body: bytes


class FakeEngine:
    """An OpenAI-compatible engine double: chat and completions (streamed or not), models, health."""

    def __init__(self, name: str, behaviour: Behaviour) -> None:
        self.name = name
        self.b = behaviour
        self.seen: list[Seen] = []
        self.cancelled = asyncio.Event()
        self.streams_started = 0
        self.streams_finished = 0
        self.health_checks = 0
        self.prompts: list[str] = []  # answered since the last reset (the toy prefix cache)
        self.resets = 0
        self.answered = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.running: Running | None = None

    @property
    def url(self) -> str:
        assert self.running is not None
        return self.running.url

    @property
    def generations(self) -> list[Seen]:
        return [s for s in self.seen if s.path.endswith("completions")]

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The generation requests' bodies, parsed."""
        return [orjson.loads(s.body) for s in self.generations]

    @property
    def headers(self) -> list[dict[str, str]]:
        """The generation requests' headers."""
        return [s.headers for s in self.generations]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/chat/completions/render", self._render)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/reset_prefix_cache", self._reset)
        app.router.add_route("*", "/v1/{tail:.+}", self._echo)
        app.router.add_post("/tokenize", self._echo)
        return app

    async def _remember(self, request: web.Request) -> Seen:
        seen = Seen(request.path_qs, request.method, dict(request.headers), await request.read())
        self.seen.append(seen)
        return seen

    async def _health(self, request: web.Request) -> web.StreamResponse:
        self.health_checks += 1
        return web.json_response({"ok": True}, status=self.b.health_status)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        data = [{"id": m, "object": "model", "created": 1, "owned_by": self.name} for m in self.b.models]
        return web.json_response({"object": "list", "data": data}, status=self.b.models_status)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        text = self.b.metrics_text
        if self.b.success_metric is not None:
            text = f"{self.b.success_metric} {self.answered}\n"
        if text is None:
            raise web.HTTPNotFound()
        return web.Response(text=text, content_type="text/plain")

    async def _reset(self, request: web.Request) -> web.StreamResponse:
        if not self.b.toy_cache:
            raise web.HTTPNotFound()
        self.prompts.clear()
        self.resets += 1
        return web.json_response({"ok": True})

    async def _render(self, request: web.Request) -> web.StreamResponse:
        seen = await self._remember(request)
        if self.b.render_ids is None:
            return web.json_response({"error": "no render"}, status=404)
        ids = self.b.render_ids(orjson.loads(seen.body))
        return web.json_response({"token_ids": ids}, status=self.b.render_status)

    async def _echo(self, request: web.Request) -> web.StreamResponse:
        seen = await self._remember(request)
        body = {"engine": self.name, "path": seen.path, "method": seen.method, "body": seen.body.decode()}
        return web.json_response(body, headers={"x-engine": self.name})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        seen = await self._remember(request)
        body = orjson.loads(seen.body)
        if self.b.fail_marker is not None and self.b.fail_marker in prompt_of(body):
            error = {"message": "boom", "type": "server_error", "param": None, "code": None}
            return web.json_response({"error": error}, status=500)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request, body)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if self.b.hang:
            await asyncio.Event().wait()
        if self.b.delay_s:
            await asyncio.sleep(self.b.delay_s)
        if self.b.fail_next > 0:
            self.b.fail_next -= 1
            return web.json_response({"error": {"message": f"{self.name} failed"}}, status=500)
        chat = request.path.endswith("chat/completions")
        cached = self._cached(body)
        if body.get("stream"):
            return await self._stream(request, body, chat, cached)
        self.answered += 1
        return web.Response(
            body=orjson.dumps(self._whole(body, chat, cached)),
            status=self.b.status,
            content_type="application/json",
            headers=self._headers(),
        )

    def _headers(self) -> dict[str, str]:
        return {"x-engine": self.name} | ({WORKER_HEADER: self.name} if self.b.worker_header else {})

    def _cached(self, body: dict[str, Any]) -> int | None:
        """The request's cached tokens: ``cached_tokens``, or the toy prefix cache's (then it remembers
        the prompt)."""
        if not self.b.toy_cache:
            return self.b.cached_tokens
        prompt = prompt_of(body)
        shared = max((shared_prefix(prompt, seen) for seen in self.prompts), default=0)
        self.prompts.append(prompt)
        return shared // 4

    def rendered_tokens(self, body: dict[str, Any]) -> int:
        """The prompt's tokens as an engine with a ChatML-like template counts them: the text at
        ``chars_per_token`` characters per token, plus 4 tokens per message (its markers and role) and 3
        for the generation prompt; a completions prompt is its text (and a BOS token)."""
        cpt = self.b.chars_per_token or 4.0
        if "messages" not in body:
            return math.ceil(len(str(body.get("prompt", ""))) / cpt) + 1
        return sum(math.ceil(len(str(m.get("content") or "")) / cpt) + 4 for m in body["messages"]) + 3

    def _usage(self, body: dict[str, Any], cached: int | None) -> dict[str, Any]:
        prompt = self.b.prompt_tokens
        if prompt is None and self.b.chars_per_token is not None:
            prompt = self.rendered_tokens(body)
        if prompt is None:
            prompt = max(len(orjson.dumps(body)) // 4, cached or 0)
        done = len(self._pieces(body)) if self.b.words_per_max_tokens else 5
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": done,
            "total_tokens": prompt + done,
        }
        if cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _whole(self, body: dict[str, Any], chat: bool, cached: int | None) -> dict[str, Any]:
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": self.b.reply},
                "finish_reason": "stop",
            }
        else:
            choice = {"index": 0, "text": self.b.reply, "finish_reason": "stop", "logprobs": None}
        return {
            "id": "fake-1",
            "object": "chat.completion" if chat else "text_completion",
            "created": 1,
            "model": body.get("model", "m"),
            "choices": [choice],
            "usage": self._usage(body, cached),
        } | self._handoff(body)

    def _handoff(self, body: dict[str, Any]) -> dict[str, Any]:
        asked = body.get("kv_transfer_params")
        if (
            self.b.kv_transfer_params is None
            or not isinstance(asked, dict)
            or not asked.get("do_remote_decode")
        ):
            return {}
        return {"kv_transfer_params": self.b.kv_transfer_params}

    def _pieces(self, body: dict[str, Any]) -> list[str]:
        if self.b.words_per_max_tokens:
            return [f"w{i} " for i in range(int(body.get("max_tokens") or 4))]
        n = max(1, self.b.chunks)
        size = max(1, -(-len(self.b.reply) // n))
        return [self.b.reply[i : i + size] for i in range(0, len(self.b.reply), size)]

    def _chunk(
        self,
        body: dict[str, Any],
        chat: bool,
        piece: str | None,
        usage: bool = False,
        cached: int | None = None,
    ) -> bytes:
        choices: list[dict[str, Any]] = []
        if piece is not None and chat:
            choices = [{"index": 0, "delta": {"role": "assistant", "content": piece}, "finish_reason": None}]
        elif piece is not None:
            choices = [{"index": 0, "text": piece, "finish_reason": None, "logprobs": None}]
        event: dict[str, Any] = {
            "id": "fake-1",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1,
            "model": body.get("model", "m"),
            "choices": choices,
        }
        if usage:
            event["usage"] = self._usage(body, cached)
        return b"data: " + orjson.dumps(event) + b"\n\n"

    async def _stream(
        self, request: web.Request, body: dict[str, Any], chat: bool, cached: int | None
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **self._headers()})
        await resp.prepare(request)
        self.streams_started += 1
        try:
            for i, piece in enumerate(self._pieces(body)):
                if self.b.die_after_chunks is not None and i >= self.b.die_after_chunks:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                if i and self.b.chunk_delay_s:
                    await asyncio.sleep(self.b.chunk_delay_s)
                await resp.write(self._chunk(body, chat, piece))
            if (body.get("stream_options") or {}).get("include_usage"):
                await resp.write(self._chunk(body, chat, None, usage=True, cached=cached))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled.set()
            raise
        self.streams_finished += 1
        self.answered += 1
        return resp


def prompt_of(body: dict[str, Any]) -> str:
    """A request's prompt as the toy prefix cache sees it: the completions prompt, or the messages as
    sorted JSON without the closing bracket (a longer conversation extends a shorter one)."""
    if "prompt" in body:
        return str(body["prompt"])
    return json.dumps(body.get("messages", []), sort_keys=True)[:-1]


def shared_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
