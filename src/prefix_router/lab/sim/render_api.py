"""vLLM's render and tokenize endpoints for the simulated engine, in vLLM's shapes (no HTTP here).

Routers that route on token ids (vllm-router's ``cache_aware``, llm-d's token producer) ask the engine to
turn a request into the prompt token ids it would compute, without generating:

- ``POST /v1/chat/completions/render``: a chat completion body -> one ``GenerateRequest``
  (``{"request_id", "token_ids", "features", "sampling_params", "model", "stream", "stream_options",
  "cache_salt", "priority", "kv_transfer_params"}``), as vLLM's ``serve/render/api_router.py``.
- ``POST /v1/completions/render``: a completion body -> a list of ``GenerateRequest``, one per prompt.
- ``POST /tokenize``: ``{"model", "prompt"}`` or ``{"model", "messages", "add_generation_prompt",
  "continue_final_message", "tools", "return_token_strs"}`` -> ``{"count", "max_model_len", "tokens",
  "token_strs"}`` (vLLM's ``TokenizeResponse``).

The ids are the simulated tokenizer's (``text.text_ids``): the same prompt gives the same ids in every
engine, and the ids of a request's rendered prompt extend those of the earlier turns of its conversation,
as a real tokenizer's do. ``sampling_params`` carries the request's sampling fields with vLLM's defaults
(a subset of vLLM's ``SamplingParams``). Bad bodies raise ``ApiError`` (OpenAI's error format).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefix_router.lab.sim.openai_api import ApiError, EngineLimits, Prompts, chat_prompt, validate
from prefix_router.lab.sim.text import text_ids, text_pieces

_SAMPLING_DEFAULTS: dict[str, Any] = {
    "n": 1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "seed": None,
    "stop": [],
    "stop_token_ids": [],
    "ignore_eos": False,
    "min_tokens": 0,
    "logprobs": None,
    "skip_special_tokens": True,
}


def render_chat(body: Any, limits: EngineLimits, request_id: str) -> dict[str, Any]:
    """``POST /v1/chat/completions/render``: one ``GenerateRequest``."""
    checked = validate("chat", body, limits)
    return _generate_request(checked, checked.prompts[0], body, limits, f"chatcmpl-{request_id}")


def render_completions(body: Any, limits: EngineLimits, request_id: str) -> list[dict[str, Any]]:
    """``POST /v1/completions/render``: one ``GenerateRequest`` per prompt."""
    checked = validate("completions", body, limits)
    return [
        _generate_request(checked, prompt, body, limits, f"cmpl-{request_id}-{i}")
        for i, prompt in enumerate(checked.prompts)
    ]


def tokenize(body: Any, limits: EngineLimits) -> dict[str, Any]:
    """``POST /tokenize``: the prompt's token ids (chat messages are rendered first)."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    _check_model(body, limits)
    text = chat_prompt(body) if "messages" in body else body.get("prompt")
    if not isinstance(text, str):
        raise ApiError("'prompt' must be a string (or send 'messages')", "prompt")
    ids = text_ids(text)
    want_strs = body.get("return_token_strs")
    if want_strs is not None and not isinstance(want_strs, bool):
        raise ApiError("'return_token_strs' must be a boolean", "return_token_strs")
    strs = text_pieces(text) if want_strs else None
    return {"count": len(ids), "max_model_len": limits.max_model_len, "tokens": ids, "token_strs": strs}


def _check_model(body: Mapping[str, Any], limits: EngineLimits) -> None:
    """vLLM's tokenize request makes ``model`` optional; when given it must be the served one."""
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise ApiError("'model' must be a string", "model")
    if model != limits.model:
        raise ApiError(f"The model `{model}` does not exist.", "model", 404, "NotFoundError")


def _generate_request(
    checked: Prompts, prompt: str | list[int], body: Mapping[str, Any], limits: EngineLimits, rid: str
) -> dict[str, Any]:
    ids = text_ids(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise ApiError("the prompt is empty", "prompt")
    if len(ids) >= limits.max_model_len:
        raise ApiError(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, your request "
            f"has {len(ids)} input tokens.",
            "messages" if checked.endpoint == "chat" else "prompt",
        )
    return {
        "request_id": rid,
        "token_ids": ids,
        "features": None,
        "sampling_params": _sampling_params(body, checked.max_tokens, limits.max_model_len - len(ids)),
        "model": checked.model,
        "stream": checked.stream,
        "stream_options": body.get("stream_options"),
        "cache_salt": checked.cache_salt,
        "priority": 0,
        "kv_transfer_params": None,
    }


def _sampling_params(body: Mapping[str, Any], max_tokens: int | None, room: int) -> dict[str, Any]:
    params = {key: body.get(key, default) for key, default in _SAMPLING_DEFAULTS.items()}
    if isinstance(params["stop"], str):
        params["stop"] = [params["stop"]]
    params["max_tokens"] = max_tokens if max_tokens is not None else room
    return params
