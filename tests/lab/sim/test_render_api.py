"""vLLM's render and tokenize shapes of the simulated engine (pure functions, no HTTP)."""

from __future__ import annotations

from typing import Any

import pytest

from prefix_router.lab.sim.openai_api import ApiError, EngineLimits, parse
from prefix_router.lab.sim.render_api import render_chat, render_completions, tokenize
from prefix_router.lab.sim.text import GENERATION_PROMPT, VOCAB_SIZE, text_ids
from prefix_router.lab.sim.text import render_chat as render_text

LIMITS = EngineLimits("m", 16, 4096)
GENERATE_REQUEST_KEYS = {"request_id", "token_ids", "features", "sampling_params", "model", "stream",
                         "stream_options", "cache_salt", "priority", "kv_transfer_params"}  # fmt: skip
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a careful assistant. " * 8},
    {"role": "user", "content": "What is a prefix cache?"},
]


def test_chat_render_is_one_generate_request_with_the_prompt_ids() -> None:
    body = {
        "model": "m",
        "messages": HISTORY,
        "max_tokens": 7,
        "temperature": 0.2,
        "stop": "x",
        "stream": True,
    }
    out = render_chat(body, LIMITS, "abc")
    assert set(out) == GENERATE_REQUEST_KEYS
    assert out["request_id"] == "chatcmpl-abc" and out["model"] == "m" and out["stream"] is True
    assert out["token_ids"] == text_ids(render_text(HISTORY))
    assert out["features"] is None and out["priority"] == 0 and out["kv_transfer_params"] is None
    params = out["sampling_params"]
    assert params["max_tokens"] == 7 and params["temperature"] == 0.2 and params["stop"] == ["x"]
    assert params["n"] == 1 and params["top_p"] == 1.0


def test_render_counts_what_the_engine_prefills() -> None:
    body = {"model": "m", "messages": HISTORY, "max_tokens": 4}
    engine_view = parse("chat", body, LIMITS, "r").generations[0].request
    assert len(render_chat(body, LIMITS, "r")["token_ids"]) == engine_view.prompt_tokens


def test_completion_render_is_a_list_one_per_prompt() -> None:
    body = {"model": "m", "prompt": ["first prompt", [5, 6, 7]]}
    out = render_completions(body, LIMITS, "abc")
    assert [item["request_id"] for item in out] == ["cmpl-abc-0", "cmpl-abc-1"]
    assert out[0]["token_ids"] == text_ids("first prompt") and out[1]["token_ids"] == [5, 6, 7]
    assert all(set(item) == GENERATE_REQUEST_KEYS for item in out)
    assert out[1]["sampling_params"]["max_tokens"] == LIMITS.max_model_len - 3  # no max_tokens: the room left


def test_tokenize_chat_and_prompt_in_vllm_shape() -> None:
    chat = tokenize({"model": "m", "messages": HISTORY, "continue_final_message": False}, LIMITS)
    assert set(chat) == {"count", "max_model_len", "tokens", "token_strs"}
    assert chat["tokens"] == render_chat({"model": "m", "messages": HISTORY}, LIMITS, "x")["token_ids"]
    assert (
        chat["count"] == len(chat["tokens"]) and chat["max_model_len"] == 4096 and chat["token_strs"] is None
    )
    plain = tokenize({"prompt": "abcdefghij", "return_token_strs": True}, LIMITS)  # model is optional
    assert plain["tokens"] == text_ids("abcdefghij") and plain["token_strs"] == ["abcd", "efgh", "ij"]


def test_tokenize_generation_prompt_options() -> None:
    with_prompt = tokenize({"messages": HISTORY}, LIMITS)["tokens"]
    without = tokenize({"messages": HISTORY, "add_generation_prompt": False}, LIMITS)["tokens"]
    assert with_prompt == text_ids(render_text(HISTORY)) and without == text_ids(
        render_text(HISTORY)[: -len(GENERATION_PROMPT)]
    )
    open_end = tokenize({"messages": HISTORY, "continue_final_message": True}, LIMITS)["tokens"]
    assert len(open_end) < len(without)
    with pytest.raises(ApiError, match="Cannot set both"):
        tokenize({"messages": HISTORY, "continue_final_message": True, "add_generation_prompt": True}, LIMITS)


def test_ids_of_a_conversation_extend_across_turns() -> None:
    """What vllm-router's cache_aware needs: turn k+1's ids start with turn k's (full tokens)."""
    first = render_chat({"model": "m", "messages": HISTORY}, LIMITS, "a")["token_ids"]
    later = [
        *HISTORY,
        {"role": "assistant", "content": "A cache of KV blocks."},
        {"role": "user", "content": "And?"},
    ]
    second = render_chat({"model": "m", "messages": later}, LIMITS, "b")["token_ids"]
    full = len(render_text(HISTORY)) // 4
    assert second[:full] == first[:full] and len(second) > len(first)
    other = render_chat({"model": "m", "messages": [{"role": "user", "content": "unrelated"}]}, LIMITS, "c")
    assert other["token_ids"][:4] != first[:4]
    assert all(0 <= t < VOCAB_SIZE for t in first + second)


@pytest.mark.parametrize(
    ("call", "body", "status", "param"),
    [
        ("chat", {"model": "other", "messages": HISTORY}, 404, "model"),
        ("chat", {"model": "m", "messages": []}, 400, "messages"),
        ("chat", {"model": "m", "messages": [{"role": "user", "content": "x" * 20_000}]}, 400, "messages"),
        ("completions", {"model": "m", "prompt": 3}, 400, "prompt"),
        ("completions", {"model": "m", "prompt": "x", "n": 2}, 400, "n"),
        ("tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
        ("tokenize", {"prompt": ["not", "a string"]}, 400, "prompt"),
        ("tokenize", {"prompt": "x", "return_token_strs": "yes"}, 400, "return_token_strs"),
        ("tokenize", [1, 2], 400, None),
    ],
)
def test_bad_bodies_are_openai_errors(call: str, body: Any, status: int, param: str | None) -> None:
    with pytest.raises(ApiError) as caught:
        if call == "chat":
            render_chat(body, LIMITS, "r")
        elif call == "completions":
            render_completions(body, LIMITS, "r")
        else:
            tokenize(body, LIMITS)
    assert caught.value.status == status and caught.value.param == param
    assert set(caught.value.body()["error"]) == {"message", "type", "param", "code"}
