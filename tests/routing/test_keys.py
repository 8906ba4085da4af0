from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefix_router.routing.keys import InvalidRequest, KeyBuilder
from prefix_router.routing.settings import KeySettings

CFG = KeySettings(block_chars=16, block_tokens=4)
KEYS = KeyBuilder(CFG)


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, **extra}


def blocks(body: dict[str, Any], tenant: str | None = None, cfg: KeySettings = CFG) -> tuple[int, ...]:
    return KeyBuilder(cfg).build("chat", body, request_id="r", tenant=tenant).blocks


def is_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return b[: len(a)] == a


messages_st = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": st.text(max_size=80)}
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=100, deadline=None)
@given(messages_st, messages_st)
def test_multi_turn_keys_are_prefixes_of_each_other(
    turn: list[dict[str, Any]], more: list[dict[str, Any]]
) -> None:
    first = blocks(chat(turn))
    second = blocks(chat(turn + more))
    assert is_prefix(first, second)


def test_generated_reply_extends_to_the_next_turn_key() -> None:
    body = chat([{"role": "system", "content": "s" * 100}, {"role": "user", "content": "q" * 40}])
    reply = {"role": "assistant", "content": "a" * 70}
    ext = KEYS.extension("chat", body, reply)
    next_turn = chat([*body["messages"], reply, {"role": "user", "content": "next" * 10}])
    assert is_prefix(ext, blocks(next_turn))
    assert len(ext) > len(blocks(body))


def test_tools_change_or_tenant_change_the_key() -> None:
    msgs = [{"role": "user", "content": "x" * 64}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    other = {"type": "function", "function": {"name": "g", "parameters": {}}}
    assert blocks(chat(msgs, tools=[tool])) != blocks(chat(msgs, tools=[other]))
    isolated = KeySettings(block_chars=16, block_tokens=4, isolate_tenants=True)
    assert blocks(chat(msgs), "t1", isolated)[0] != blocks(chat(msgs), "t2", isolated)[0]
    assert blocks(chat(msgs), "t1")[0] == blocks(chat(msgs), "t2")[0]  # shared when not isolated


def test_namespace_separates_models_salt_and_adapters() -> None:
    msgs = [{"role": "user", "content": "x" * 64}]
    base = blocks(chat(msgs))[0]
    assert blocks({"model": "other", "messages": msgs})[0] != base
    assert blocks(chat(msgs, cache_salt="s"))[0] != base
    assert blocks(chat(msgs, lora_path="ad"))[0] != base


def test_images_hash_by_url_and_tool_calls_count() -> None:
    def with_image(url: str) -> tuple[int, ...]:
        part = {"type": "image_url", "image_url": {"url": url}}
        return blocks(chat([{"role": "user", "content": [part, {"type": "text", "text": "t" * 64}]}]))

    assert with_image("a") != with_image("b")
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    a = chat(
        [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "user", "content": "u" * 40}]
    )
    b = chat([{"role": "assistant", "content": None}, {"role": "user", "content": "u" * 40}])
    assert blocks(a) != blocks(b)


def test_completions_prompt_forms() -> None:
    text = KEYS.build("completions", {"model": "m", "prompt": "p" * 40}, request_id="r")
    batch = KEYS.build("completions", {"model": "m", "prompt": ["p" * 40, "z"]}, request_id="r")
    assert text.blocks == batch.blocks and len(text.blocks) == 2 and text.prompt_tokens == 10
    ids = KEYS.build("completions", {"model": "m", "prompt": list(range(10))}, request_id="r")
    assert ids.prompt_tokens == 10 and len(ids.blocks) == 2
    more = KEYS.build("completions", {"model": "m", "prompt": [list(range(12))]}, request_id="r")
    assert is_prefix(ids.blocks, more.blocks)


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("chat", {"messages": [{"role": "user", "content": "x"}]}, "model"),
        ("chat", {"model": 3, "messages": []}, "model"),
        ("chat", {"model": "m"}, "messages"),
        ("chat", {"model": "m", "messages": "hi"}, "messages"),
        ("chat", {"model": "m", "messages": [{"content": "x"}]}, "messages[0].role"),
        ("chat", {"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ("chat", {"model": "m", "messages": [{"role": "user", "content": [1]}]}, "messages[0].content[0]"),
        ("chat", {"model": "m", "messages": [{"role": "user"}], "tools": "x"}, "tools"),
        ("completions", {"model": "m"}, "prompt"),
        ("completions", {"model": "m", "prompt": 5}, "prompt"),
        ("completions", {"model": "m", "prompt": [-1, 2]}, "prompt"),
        ("completions", {"model": "m", "prompt": "x", "cache_salt": 1}, "cache_salt"),
    ],
)
def test_bad_bodies_are_rejected_with_the_param(endpoint: Any, body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        KEYS.build(endpoint, body, request_id="r")
    assert err.value.param == param


json_st = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["model", "messages", "prompt", "tools", "cache_salt"]), json_st))
def test_arbitrary_json_is_routed_or_rejected_never_crashes(body: dict[str, Any]) -> None:
    for endpoint in ("chat", "completions"):
        try:
            req = KEYS.build(endpoint, body, request_id="r")  # type: ignore[arg-type]
        except InvalidRequest:
            continue
        assert req.prompt_tokens >= 0


def test_max_prefix_chars_caps_the_examined_prefix() -> None:
    cfg = KeySettings(block_chars=16, block_tokens=4, max_prefix_chars=32)
    body = chat([{"role": "user", "content": "x" * 500}])
    assert len(blocks(body, cfg=cfg)) == 2


def test_tokenizer_mode_blocks_are_token_ids() -> None:
    builder = KeyBuilder(CFG, tokenize=lambda text: [ord(c) for c in text])
    req = builder.build("chat", chat([{"role": "user", "content": "y" * 30}]), request_id="r")
    assert req.prompt_tokens == len("user\x1f\x1f" + "y" * 30 + "\x1f\x1f\x1e")
    assert len(req.blocks) == req.prompt_tokens // 4


@settings(max_examples=150, deadline=None)
@given(messages_st, st.text(max_size=200), st.sampled_from(["chat", "completions"]))
def test_incremental_extension_equals_full_rehash(
    turn: list[dict[str, Any]], reply: str, endpoint: str
) -> None:
    builder = KeyBuilder(CFG)
    body: dict[str, Any] = chat(turn) if endpoint == "chat" else {"model": "m", "prompt": reply[::-1] + "p"}
    generated = {"role": "assistant", "content": reply} if endpoint == "chat" else {"text": reply}
    req = builder.build(endpoint, body, request_id="r")  # type: ignore[arg-type]
    fast = builder.extend(req, endpoint, body, generated)  # type: ignore[arg-type]
    assert fast == builder.extension(endpoint, body, generated)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(messages_st, st.text(max_size=200), st.integers(1, 400))  # 0 is refused (KeySettings)
def test_incremental_extension_respects_the_prefix_cap(
    turn: list[dict[str, Any]], reply: str, cap: int
) -> None:
    builder = KeyBuilder(KeySettings(block_chars=16, block_tokens=4, max_prefix_chars=cap))
    body, generated = chat(turn), {"role": "assistant", "content": reply}
    req = builder.build("chat", body, request_id="r")
    fast = builder.extend(req, "chat", body, generated)
    assert fast == builder.extension("chat", body, generated)
    assert len(fast) <= cap // 16
