"""OpenAI request validation and response shapes for the simulated engine (no HTTP here).

``parse`` turns a request body into engine requests plus the text each will generate; bad input raises
``ApiError`` carrying the HTTP status and the OpenAI error body fields.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from prefix_router.lab.sim.engine import EngineRequest
from prefix_router.lab.sim.text import (
    END,
    generate_ids,
    id_blocks,
    ids_text,
    namespace_seed,
    natural_length,
    render_chat,
    text_blocks,
    text_ids,
    token_count,
)
from prefix_router.protocol import Endpoint

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_BATCH = 64


class ApiError(Exception):
    """An error answered in OpenAI's format: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.kind = kind

    def body(self) -> dict[str, Any]:
        code = "model_not_found" if self.status == 404 else None
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": code}}


@dataclass(frozen=True, slots=True)
class Generation:
    """One engine request and the reply it will produce."""

    request: EngineRequest
    output: tuple[int, ...]
    finish_reason: str
    full: str | tuple[int, ...] = ""  # prompt + reply as the engine caches it (the extension's content)

    def full_ids(self) -> list[int]:
        """The token ids of ``full``: block ``i`` of ``request.extension`` holds ids ``[i*B, (i+1)*B)``."""
        return text_ids(self.full) if isinstance(self.full, str) else list(self.full)


@dataclass(frozen=True, slots=True)
class ApiRequest:
    endpoint: Endpoint
    model: str
    generations: tuple[Generation, ...]
    stream: bool
    include_usage: bool
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class EngineLimits:
    model: str
    block_tokens: int
    max_model_len: int


# ---------------------------------------------------------------------- parsing


@dataclass(frozen=True, slots=True)
class Prompts:
    """A validated request body: its prompts (rendered chat text, completion text or token ids)."""

    endpoint: Endpoint
    model: str
    prompts: tuple[str | list[int], ...]
    max_tokens: int | None
    cache_salt: str | None
    stream: bool
    include_usage: bool


def validate(endpoint: Endpoint, body: Any, limits: EngineLimits) -> Prompts:
    """Check a request body as the engine does (raises ``ApiError``); renders chat messages."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    model = _model(body, limits)
    max_tokens = _max_tokens(body)
    _check_n(body)
    salt = _optional_str(body, "cache_salt")
    prompts = _chat_prompts(body) if endpoint == "chat" else _completion_prompts(body)
    stream = _flag(body, "stream")
    return Prompts(endpoint, model, tuple(prompts), max_tokens, salt, stream, stream and _include_usage(body))


def parse(endpoint: Endpoint, body: Any, limits: EngineLimits, request_id: str) -> ApiRequest:
    checked = validate(endpoint, body, limits)
    seed = namespace_seed(checked.model, checked.cache_salt)
    gens = tuple(
        _generation(endpoint, prompt, seed, checked.max_tokens, limits, f"{request_id}-{i}")
        for i, prompt in enumerate(checked.prompts)
    )
    return ApiRequest(
        endpoint, checked.model, gens, checked.stream, checked.include_usage, checked.cache_salt
    )


def _model(body: Mapping[str, Any], limits: EngineLimits) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError("'model' is required and must be a string", "model")
    if model != limits.model:
        raise ApiError(f"The model `{model}` does not exist.", "model", 404, "NotFoundError")
    return model


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ApiError(f"'{key}' must be a positive integer", key)
        return value
    return None


def _check_n(body: Mapping[str, Any]) -> None:
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise ApiError("the simulated engine supports only n=1", "n")


def _optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ApiError(f"'{key}' must be a string", key)
    return value


def _flag(body: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(f"'{key}' must be a boolean", key)
    return value


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise ApiError("'stream_options' must be an object", "stream_options")
    return _flag(options, "include_usage")


def _chat_prompts(body: Mapping[str, Any]) -> list[str | list[int]]:
    return [chat_prompt(body)]


def chat_prompt(body: Mapping[str, Any]) -> str:
    """The rendered prompt of a chat body (``messages``, ``tools``, ``add_generation_prompt``,
    ``continue_final_message`` as in vLLM); raises ``ApiError`` on a malformed body."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty array", "messages")
    for i, message in enumerate(messages):
        _check_message(message, f"messages[{i}]")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ApiError("'tools' must be an array", "tools")
    add_prompt = _flag(body, "add_generation_prompt", default=True)
    continue_final = _flag(body, "continue_final_message")
    if add_prompt and continue_final and "add_generation_prompt" in body:
        raise ApiError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    return render_chat(
        messages, tools, add_generation_prompt=add_prompt, continue_final_message=continue_final
    )


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise ApiError(f"'{where}' must be an object", where)
    if message.get("role") not in ROLES:
        raise ApiError(f"'{where}.role' must be one of {sorted(ROLES)}", f"{where}.role")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list) or not all(_is_part(p) for p in content):
        raise ApiError(f"'{where}.content' must be a string or an array of content parts", where)


def _is_part(part: Any) -> bool:
    return isinstance(part, dict) and isinstance(part.get("type"), str)


def _completion_prompts(body: Mapping[str, Any]) -> list[str | list[int]]:
    prompt: Any = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list):
        prompt = None
    elif _is_ids(prompt):
        return [list(prompt)]
    elif 0 < len(prompt) <= MAX_BATCH and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        return [p if isinstance(p, str) else list(p) for p in prompt]
    raise ApiError(
        f"'prompt' must be a string, an array of token ids, or an array of up to {MAX_BATCH} of those",
        "prompt",
    )


def _is_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in value)
    )


# ---------------------------------------------------------------------- engine requests


def _generation(
    endpoint: Endpoint,
    prompt: str | list[int],
    seed: int,
    max_tokens: int | None,
    limits: EngineLimits,
    request_id: str,
) -> Generation:
    prompt_tokens = token_count(prompt) if isinstance(prompt, str) else len(prompt)
    if prompt_tokens < 1:
        raise ApiError("the prompt is empty", "prompt")
    reply_seed = _prompt_hash(prompt, seed)
    if max_tokens is None:
        room = max(1, limits.max_model_len - prompt_tokens)
        count, reason = min(natural_length(reply_seed), room), "stop"
    else:
        count, reason = max_tokens, "length"
    output = generate_ids(reply_seed, count)
    blocks, extension, full = _blocks(endpoint, prompt, output, limits.block_tokens, seed)
    request = EngineRequest(request_id, prompt_tokens, count, blocks, extension)
    return Generation(request, tuple(output), reason, full)


def _prompt_hash(prompt: str | list[int], seed: int) -> int:
    data = prompt.encode() if isinstance(prompt, str) else repr(prompt).encode()
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def _blocks(
    endpoint: Endpoint, prompt: str | list[int], output: list[int], block_tokens: int, seed: int
) -> tuple[tuple[int, ...], tuple[int, ...], str | tuple[int, ...]]:
    """(the prompt's blocks, the blocks of prompt + reply, prompt + reply)."""
    if isinstance(prompt, list):
        ids = prompt + output
        return id_blocks(prompt, block_tokens, seed), id_blocks(ids, block_tokens, seed), tuple(ids)
    tail = END if endpoint == "chat" else ""
    full = prompt + ids_text(output) + tail
    return text_blocks(prompt, block_tokens, seed), text_blocks(full, block_tokens, seed), full


# ---------------------------------------------------------------------- responses


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def response_id(endpoint: Endpoint, request_id: str) -> str:
    return ("chatcmpl-" if endpoint == "chat" else "cmpl-") + request_id


def full_response(
    api: ApiRequest, request_id: str, texts: Sequence[str], usage_body: dict[str, Any]
) -> dict[str, Any]:
    choices = [_choice(api.endpoint, i, text, g.finish_reason) for i, (g, text) in _pairs(api, texts)]
    kind = "chat.completion" if api.endpoint == "chat" else "text_completion"
    return _envelope(api, request_id, kind) | {"choices": choices, "usage": usage_body}


def _pairs(api: ApiRequest, texts: Sequence[str]) -> list[tuple[int, tuple[Generation, str]]]:
    return list(enumerate(zip(api.generations, texts, strict=True)))


def _choice(endpoint: Endpoint, index: int, text: str, reason: str) -> dict[str, Any]:
    if endpoint == "chat":
        message = {"role": "assistant", "content": text, "tool_calls": []}
        return {"index": index, "message": message, "logprobs": None, "finish_reason": reason}
    return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}


def _envelope(api: ApiRequest, request_id: str, kind: str) -> dict[str, Any]:
    return {"id": response_id(api.endpoint, request_id), "object": kind, "created": int(time.time())} | {
        "model": api.model
    }


def chunk(
    api: ApiRequest, request_id: str, index: int, text: str | None, reason: str | None, first: bool = False
) -> dict[str, Any]:
    """One streamed chunk: a text delta (``text``) or the closing chunk (``reason``)."""
    kind = "chat.completion.chunk" if api.endpoint == "chat" else "text_completion"
    if api.endpoint == "chat":
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
    else:
        choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": reason}
    body = _envelope(api, request_id, kind) | {"choices": [choice]}
    if api.include_usage:
        body["usage"] = None
    return body


def usage_chunk(api: ApiRequest, request_id: str, usage_body: dict[str, Any]) -> dict[str, Any]:
    kind = "chat.completion.chunk" if api.endpoint == "chat" else "text_completion"
    return _envelope(api, request_id, kind) | {"choices": [], "usage": usage_body}
