"""One streamed request through the official ``openai`` client, timed from the client's side.

TTFT is the time from sending the request to the first streamed chunk that carries generated output
(text, content or a tool call); e2e is the time to the end of the stream. Usage (prompt, completion and
engine-reported cached tokens) comes from the final chunk (``stream_options={"include_usage": True}``);
the worker that served the request from the router's ``x-prefix-router-worker`` response header, and the
router's predicted cached tokens from ``x-prefix-router-prefix-match`` (prefix-router only).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionStreamOptionsParam

from prefix_router.protocol import MATCH_HEADER, WORKER_HEADER, Endpoint

_STREAM_OPTIONS: ChatCompletionStreamOptionsParam = {"include_usage": True}
MAX_REPLY_CHARS = 1 << 20  # generated text kept for the next turn's history (the rest is only counted)
MAX_TOOL_CALLS = 64  # tool calls kept per reply


@dataclass(slots=True)
class RequestRecord:
    """What the client measured for one request (times in seconds, offsets from the run start)."""

    session_id: str
    turn: int
    endpoint: str
    start_s: float
    e2e_s: float = 0.0
    ttft_s: float | None = None
    ok: bool = True
    error: str | None = None
    status: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int = 0
    worker: str | None = None
    predicted_tokens: int | None = None


@dataclass(slots=True)
class StreamState:
    """Accumulates a stream: first-output time, text, tool calls, usage."""

    started: float
    first_output: float | None = None
    first_chunk: float | None = None
    text: list[str] = field(default_factory=list)
    text_chars: int = 0
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    chunks_with_output: int = 0
    usage: Any = None

    def add_text(self, text: str) -> None:
        """Keep at most ``MAX_REPLY_CHARS`` characters of generated text."""
        room = MAX_REPLY_CHARS - self.text_chars
        if room > 0:
            self.text.append(text[:room])
            self.text_chars += min(len(text), room)

    def saw_output(self, now: float) -> None:
        self.chunks_with_output += 1
        if self.first_output is None:
            self.first_output = now


async def send(
    client: AsyncOpenAI,
    endpoint: Endpoint,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    record: RequestRecord,
) -> dict[str, Any] | None:
    """Send ``body`` streamed; fill ``record``; return the generated assistant message (chat) or None."""
    state = StreamState(started=time.perf_counter())
    try:
        await _stream(client, endpoint, dict(body), headers, state, record)
    except openai.APIStatusError as exc:
        _fail(record, f"HTTP {exc.status_code}: {_message(exc)}", exc.status_code)
    except (openai.APIError, OSError, TimeoutError) as exc:
        _fail(record, f"{type(exc).__name__}: {exc}", None)
    _finish(record, state)
    return reply_message(state) if endpoint == "chat" and record.ok else None


async def _stream(
    client: AsyncOpenAI,
    endpoint: Endpoint,
    body: dict[str, Any],
    headers: Mapping[str, str],
    state: StreamState,
    record: RequestRecord,
) -> None:
    model = body.pop("model")
    for key in ("stream", "stream_options"):
        body.pop(key, None)
    if endpoint == "chat":
        raw: Any = await client.chat.completions.with_raw_response.create(
            model=model, messages=body.pop("messages"), stream=True, stream_options=_STREAM_OPTIONS,
            extra_body=body, extra_headers=dict(headers),
        )  # fmt: skip
    else:
        raw = await client.completions.with_raw_response.create(
            model=model, prompt=body.pop("prompt"), stream=True, stream_options=_STREAM_OPTIONS,
            extra_body=body, extra_headers=dict(headers),
        )  # fmt: skip
    record.status = raw.status_code
    record.worker = raw.headers.get(WORKER_HEADER)
    record.predicted_tokens = _int_or_none(raw.headers.get(MATCH_HEADER))
    async for chunk in raw.parse():
        absorb(chunk, state, time.perf_counter())


def absorb(chunk: Any, state: StreamState, now: float) -> None:
    """Fold one chat or completions chunk into ``state``."""
    if state.first_chunk is None:
        state.first_chunk = now
    if getattr(chunk, "usage", None) is not None:
        state.usage = chunk.usage
    for choice in chunk.choices or ():
        delta = getattr(choice, "delta", None)
        if delta is None:
            _absorb_text(getattr(choice, "text", None), state, now)
        else:
            _absorb_delta(delta, state, now)


def _absorb_text(text: str | None, state: StreamState, now: float) -> None:
    if text:
        state.add_text(text)
        state.saw_output(now)


def _absorb_delta(delta: Any, state: StreamState, now: float) -> None:
    extra = getattr(delta, "model_extra", None) or {}
    reasoning = extra.get("reasoning_content") or extra.get("reasoning")
    if delta.content:
        state.add_text(delta.content)
    for call in delta.tool_calls or ():
        _absorb_tool_call(call, state)
    if delta.content or delta.tool_calls or reasoning:
        state.saw_output(now)


def _absorb_tool_call(call: Any, state: StreamState) -> None:
    if call.index not in state.tool_calls and len(state.tool_calls) >= MAX_TOOL_CALLS:
        return
    slot = state.tool_calls.setdefault(
        call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    )
    slot["id"] = call.id or slot["id"]
    if call.function is not None:
        slot["function"]["name"] += call.function.name or ""
        slot["function"]["arguments"] += call.function.arguments or ""


def reply_message(state: StreamState) -> dict[str, Any]:
    """The assistant message as the next turn's history carries it."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(state.text)}
    if state.tool_calls:
        message["tool_calls"] = [state.tool_calls[i] for i in sorted(state.tool_calls)]
        message["content"] = message["content"] or None
    return message


def _finish(record: RequestRecord, state: StreamState) -> None:
    end = time.perf_counter()
    record.e2e_s = end - state.started
    first = state.first_output or state.first_chunk
    record.ttft_s = None if first is None or not record.ok else first - state.started
    usage = state.usage
    record.output_tokens = state.chunks_with_output if usage is None else int(usage.completion_tokens or 0)
    if usage is not None:
        record.prompt_tokens = int(usage.prompt_tokens or 0)
        record.cached_tokens = cached_tokens(usage)


def cached_tokens(usage: Any) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens``, None when the engine does not report it."""
    details = getattr(usage, "prompt_tokens_details", None)
    value = getattr(details, "cached_tokens", None) if details is not None else None
    return None if value is None else int(value)


def _int_or_none(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _fail(record: RequestRecord, message: str, status: int | None) -> None:
    record.ok = False
    record.error = message[:300]
    record.status = status


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and "message" in inner:
            return str(inner["message"])
    return str(exc.message)
