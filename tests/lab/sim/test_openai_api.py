from __future__ import annotations

from typing import Any

import pytest

from prefix_router.lab.sim.openai_api import MAX_BATCH, ApiError, EngineLimits, parse
from support.bodies import ask

LIMITS = EngineLimits("m", 16, 4096)


def chat(**extra: Any) -> dict[str, Any]:
    return ask("hi") | extra


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": ["hi"]}, "messages[0]"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0]"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(max_tokens="9"), "max_tokens"),
        (chat(max_completion_tokens=-1), "max_completion_tokens"),
        (chat(n=2), "n"),
        (chat(stream="yes"), "stream"),
        (chat(stream=True, stream_options=[1]), "stream_options"),
        (chat(tools={"a": 1}), "tools"),
    ],
)
def test_bad_chat_bodies_are_400_with_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        parse("chat", body, LIMITS, "r")
    assert info.value.status == 400
    assert info.value.param == param
    assert set(info.value.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("prompt", [None, 5, [], [1.5], [[1, -2]], ["a", 3], ""])
def test_bad_prompts_are_400(prompt: Any) -> None:
    with pytest.raises(ApiError) as info:
        parse("completions", {"model": "m", "prompt": prompt}, LIMITS, "r")
    assert info.value.status == 400 and info.value.param == "prompt"


def test_unknown_model_is_404() -> None:
    with pytest.raises(ApiError) as info:
        parse("chat", {**chat(), "model": "other"}, LIMITS, "r")
    assert info.value.status == 404 and info.value.body()["error"]["code"] == "model_not_found"


def test_max_tokens_is_respected_and_preferred_from_max_completion_tokens() -> None:
    api = parse("chat", chat(max_tokens=7, max_completion_tokens=3), LIMITS, "r")
    assert api.generations[0].request.output_tokens == 3
    assert len(api.generations[0].output) == 3
    assert api.generations[0].finish_reason == "length"


def test_without_max_tokens_the_reply_stops_naturally() -> None:
    api = parse("chat", chat(), LIMITS, "r")
    generation = api.generations[0]
    assert generation.finish_reason == "stop"
    assert 1 <= generation.request.output_tokens <= LIMITS.max_model_len


def test_completion_batches_and_token_ids() -> None:
    api = parse(
        "completions", {"model": "m", "prompt": ["ab" * 100, [1, 2, 3]], "max_tokens": 2}, LIMITS, "r"
    )
    text, ids = (g.request for g in api.generations)
    assert text.prompt_tokens == 50 and ids.prompt_tokens == 3
    assert len(text.blocks) == 3 and ids.blocks == ()


def test_the_extension_starts_with_the_prompt_blocks() -> None:
    api = parse("chat", chat(max_tokens=64, messages=[{"role": "user", "content": "q" * 300}]), LIMITS, "r")
    req = api.generations[0].request
    assert req.extension[: len(req.blocks)] == req.blocks
    assert len(req.extension) > len(req.blocks)


def test_completion_batches_are_bounded() -> None:
    body = {"model": "m", "prompt": ["x"] * (MAX_BATCH + 1)}
    with pytest.raises(ApiError):
        parse("completions", body, LIMITS, "r")
    assert (
        len(parse("completions", {**body, "prompt": ["x"] * MAX_BATCH}, LIMITS, "r").generations) == MAX_BATCH
    )
