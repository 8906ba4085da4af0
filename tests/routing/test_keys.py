from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefix_router.routing.keys import InvalidRequest, KeyBuilder
from prefix_router.routing.settings import KeySettings
from support.bodies import chat

CFG = KeySettings(block_tokens=4)
KEYS = KeyBuilder(CFG)


def blocks(body: dict[str, Any], tenant: str | None = None, cfg: KeySettings = CFG) -> tuple[int, ...]:
    return KeyBuilder(cfg).build("chat", body, route_id="r", tenant=tenant).blocks


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
    isolated = KeySettings(block_tokens=4, isolate_tenants=True)
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
    text = KEYS.build("completions", {"model": "m", "prompt": "p" * 40}, route_id="r")
    batch = KEYS.build("completions", {"model": "m", "prompt": ["p" * 40, "z"]}, route_id="r")
    assert text.blocks == batch.blocks and len(text.blocks) == 2 and text.key_tokens == 10
    ids = KEYS.build("completions", {"model": "m", "prompt": list(range(10))}, route_id="r")
    assert ids.key_tokens == 10 and len(ids.blocks) == 2
    more = KEYS.build("completions", {"model": "m", "prompt": [list(range(12))]}, route_id="r")
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
        ("chat", {"model": "m", "messages": [{"role": "user", "content": "x"}, 5]}, "messages[1]"),
        ("chat", {"model": "m", "messages": [{"role": "tool", "tool_calls": "x"}]}, "messages[0].tool_calls"),
        ("chat", {"model": "m", "messages": [{"role": "user"}], "tools": "x"}, "tools"),
        ("completions", {"model": "m"}, "prompt"),
        ("completions", {"model": "m", "prompt": 5}, "prompt"),
        ("completions", {"model": "m", "prompt": [-1, 2]}, "prompt"),
        ("completions", {"model": "m", "prompt": "x", "cache_salt": 1}, "cache_salt"),
    ],
)
def test_bad_bodies_are_rejected_with_the_param(endpoint: Any, body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        KEYS.build(endpoint, body, route_id="r")
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
            req = KEYS.build(endpoint, body, route_id="r")  # type: ignore[arg-type]
        except InvalidRequest:
            continue
        assert req.key_tokens >= 0


def test_max_prefix_chars_caps_the_examined_prefix() -> None:
    cfg = KeySettings(block_tokens=4, max_prefix_chars=32)
    body = chat([{"role": "user", "content": "x" * 500}])
    assert len(blocks(body, cfg=cfg)) == 2


def test_tokenizer_mode_blocks_are_token_ids() -> None:
    builder = KeyBuilder(CFG, tokenize=lambda text: [ord(c) for c in text])
    req = builder.build("chat", chat([{"role": "user", "content": "y" * 30}]), route_id="r")
    assert req.key_tokens == len("user\x03" + "y" * 30 + "\x1e")  # role, content behind its tag, end
    assert len(req.blocks) == req.key_tokens // 4


@settings(max_examples=150, deadline=None)
@given(messages_st, st.text(max_size=200), st.sampled_from(["chat", "completions"]))
def test_incremental_extension_equals_full_rehash(
    turn: list[dict[str, Any]], reply: str, endpoint: str
) -> None:
    builder = KeyBuilder(CFG)
    body: dict[str, Any] = chat(turn) if endpoint == "chat" else {"model": "m", "prompt": reply[::-1] + "p"}
    generated = {"role": "assistant", "content": reply} if endpoint == "chat" else {"text": reply}
    req = builder.build(endpoint, body, route_id="r")  # type: ignore[arg-type]
    fast = builder.extend(req, endpoint, body, generated)  # type: ignore[arg-type]
    assert fast == builder.extension(endpoint, body, generated)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(messages_st, st.text(max_size=200), st.integers(1, 400))  # 0 is refused (KeySettings)
def test_incremental_extension_respects_the_prefix_cap(
    turn: list[dict[str, Any]], reply: str, cap: int
) -> None:
    builder = KeyBuilder(KeySettings(block_tokens=4, max_prefix_chars=cap))
    body, generated = chat(turn), {"role": "assistant", "content": reply}
    req = builder.build("chat", body, route_id="r")
    fast = builder.extend(req, "chat", body, generated)
    assert fast == builder.extension("chat", body, generated)
    assert len(fast) <= cap // 16


# ---------------------------------------------------------------- template-faithful order (issue 12)

SYSTEM = {"role": "system", "content": "s" * 640}
TOOL_F = {
    "type": "function",
    "function": {"name": "f", "description": "d" * 100, "parameters": {"type": "object"}},
}
TOOL_G = {
    "type": "function",
    "function": {"name": "g", "description": "e" * 100, "parameters": {"type": "object"}},
}


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_system_prompt_comes_before_the_tools() -> None:
    """Changed deliberately (issue 12): templates render the first system message before any tool text, so
    requests with other tool lists share the system prompt (the old key put the tools first)."""
    msgs = [SYSTEM, {"role": "user", "content": "u" * 64}]
    a, b = blocks(chat(msgs, tools=[TOOL_F])), blocks(chat(msgs, tools=[TOOL_G]))
    assert a != b and shared(a, b) >= 640 // 16
    no_tools = blocks(chat(msgs))
    assert shared(no_tools, a) >= 640 // 16  # ChatML-like templates: the system prompt either way
    llama = [
        blocks({**chat(msgs, **extra), "model": "meta-llama/Llama-3.1-8B"})
        for extra in ({}, {"tools": [TOOL_F]})
    ]
    assert shared(*llama) == 0  # with and without tools never share (Llama 3.x's system header)


def test_tool_schemas_keep_the_clients_key_order() -> None:
    """Changed deliberately (issue 12): transformers' tojson keeps key order, so the same tools with keys in
    another order render other text (the old key sorted keys)."""
    msgs = [SYSTEM, {"role": "user", "content": "u" * 64}]
    flipped = {"function": TOOL_F["function"], "type": "function"}
    a, b = blocks(chat(msgs, tools=[TOOL_F])), blocks(chat(msgs, tools=[flipped]))
    assert a != b and shared(a, b) >= 640 // 16


def test_text_parts_are_joined_with_a_newline() -> None:
    def parts(*texts: str) -> dict[str, Any]:
        return chat([{"role": "user", "content": [{"type": "text", "text": t} for t in texts]}])

    assert blocks(parts("a" * 40, "b" * 40)) == blocks(
        chat([{"role": "user", "content": "a" * 40 + "\n" + "b" * 40}])
    )
    assert blocks(parts("a" * 40, "b" * 40)) != blocks(
        chat([{"role": "user", "content": "a" * 40 + "b" * 40}])
    )


def test_an_image_is_valued_at_image_tokens() -> None:
    cfg = KeySettings(block_tokens=4, image_tokens=300)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    text = {"type": "text", "text": "t" * 64}
    with_image = KeyBuilder(cfg).build(
        "chat", chat([{"role": "user", "content": [image, text]}]), route_id="r"
    )
    without = KeyBuilder(cfg).build("chat", chat([{"role": "user", "content": [text]}]), route_id="r")
    assert with_image.key_tokens - without.key_tokens in range(300, 302)


@pytest.mark.parametrize(
    "extra",
    [
        {"chat_template": "{{ messages }}"},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"reasoning_effort": "low"},
        {"add_special_tokens": True},
        {"mm_processor_kwargs": {"fps": 2}},
        {"truncate_prompt_tokens": 100},
    ],
)
def test_prompt_options_without_a_fixed_place_enter_the_namespace(extra: dict[str, Any]) -> None:
    msgs = [SYSTEM, {"role": "user", "content": "u" * 64}]
    assert shared(blocks(chat(msgs)), blocks(chat(msgs, **extra))) == 0


@pytest.mark.parametrize(
    ("extra", "at_least"),
    [
        ({"documents": [{"text": "d" * 100}]}, 640 // 16),  # after the system part
        ({"add_generation_prompt": False}, (640 + 64) // 16),  # at the end
        ({"continue_final_message": True}, (640 + 64) // 16),
        ({"tools": [TOOL_F], "tool_choice": "none"}, 0),  # engines may drop the tools then
    ],
)
def test_prompt_fields_enter_the_key_where_they_change_the_text(extra: dict[str, Any], at_least: int) -> None:
    msgs = [SYSTEM, {"role": "user", "content": "u" * 64}]
    base = chat(msgs, tools=[TOOL_F]) if "tool_choice" in extra else chat(msgs)
    a, b = blocks(base), blocks({**base, **extra})
    assert a != b and shared(a, b) >= at_least


SAMPLING_ST = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0, 1),
        "max_tokens": st.integers(1, 10_000),
        "max_completion_tokens": st.integers(1, 10_000),
        "stream": st.booleans(),
        "seed": st.integers(0, 2**31),
        "n": st.integers(1, 8),
        "stop": st.lists(st.text(max_size=5), max_size=3),
        "user": st.text(max_size=20),
        "stream_options": st.just({"include_usage": True}),
        "logprobs": st.booleans(),
        "presence_penalty": st.floats(-2, 2),
        "response_format": st.just({"type": "json_object"}),
    },
)


@settings(max_examples=100, deadline=None)
@given(messages_st, SAMPLING_ST)
def test_sampling_fields_never_change_the_key(
    messages: list[dict[str, Any]], sampling: dict[str, Any]
) -> None:
    plain = KEYS.build("chat", chat(messages, tools=[TOOL_F]), route_id="r")
    other = KEYS.build("chat", chat(messages, tools=[TOOL_F], **sampling), route_id="r")
    assert (plain.blocks, plain.key_tokens, plain.hash_key, plain.tail) == (
        other.blocks, other.key_tokens, other.hash_key, other.tail,
    )  # fmt: skip


def test_reasoning_counts_only_after_the_last_user_message() -> None:
    """Reasoning models' templates drop earlier turns' reasoning (``reasoning_content`` or inline
    ``<think>``) and keep it in the current turn's tool loop."""
    user = {"role": "user", "content": "q" * 64}
    think = {"role": "assistant", "content": "<think>\n" + "r" * 200 + "\n</think>\n\n" + "a" * 64}
    plain = {"role": "assistant", "content": "a" * 64}
    later = {"role": "user", "content": "next" * 16}
    assert blocks(chat([SYSTEM, user, think, later])) == blocks(chat([SYSTEM, user, plain, later]))
    rc = {"role": "assistant", "content": "a" * 64, "reasoning_content": "r" * 200}
    tool = {"role": "tool", "tool_call_id": "1", "content": "x" * 64}
    assert blocks(chat([SYSTEM, user, rc, tool])) != blocks(chat([SYSTEM, user, plain, tool]))


def test_a_reply_with_reasoning_or_a_tool_call_extends_only_what_the_next_turn_shares() -> None:
    body = chat([SYSTEM, {"role": "user", "content": "q" * 64}])
    prompt = blocks(body)
    reasoned = {"role": "assistant", "content": "a" * 200, "reasoning_content": ""}
    assert KEYS.extension("chat", body, reasoned) == prompt
    inline = {"role": "assistant", "content": "<think>\n" + "r" * 100 + "</think>" + "a" * 200}
    assert KEYS.extension("chat", body, inline) == prompt
    call = {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}' * 20}}
    with_text = {"role": "assistant", "content": "a" * 200, "tool_calls": [call]}
    ext = KEYS.extension("chat", body, with_text)
    nxt = blocks(chat([*body["messages"], with_text, {"role": "tool", "content": "r" * 64}]))
    assert len(prompt) < len(ext) and is_prefix(ext, nxt)
    only_call = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert KEYS.extension("chat", body, only_call) == prompt
    builder = KeyBuilder(CFG)
    req = builder.build("chat", body, route_id="r")
    for reply in (reasoned, inline, with_text, only_call):
        assert builder.extend(req, "chat", body, reply) == builder.extension("chat", body, reply)


# ------------------------------------------------------------ tools and the system prompt, per template

TEMPLATES = Path(__file__).parents[2] / "src/prefix_router/lab/bench/fidelity/templates"
LONG_SYSTEM = "You are a careful assistant for the accounts team. " * 40  # about 2,000 characters
LOOKUP_TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def rendered(template: str, body: dict[str, Any]) -> str:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent)
    env.globals["raise_exception"] = lambda message: (_ for _ in ()).throw(ValueError(message))
    env.globals["strftime_now"] = lambda fmt: "01 Jan 2026"
    source = (TEMPLATES / template).read_text()
    context = {"messages": body["messages"], "tools": body.get("tools"), "add_generation_prompt": True}
    return env.from_string(source).render(bos_token="<s>", eos_token="</s>", **context)


def shared_chars(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize(
    ("template", "model"),
    [
        ("qwen2.5.jinja", "Qwen/Qwen2.5-7B-Instruct"),
        ("qwen3.jinja", "Qwen/Qwen3-8B"),
        ("llama3.1.jinja", "meta-llama/Llama-3.1-8B-Instruct"),
    ],
)
def test_with_and_without_tools_the_key_shares_what_the_template_shares(template: str, model: str) -> None:
    """A request without tools after one with tools and the same long system prompt: the keys share the
    system prompt where the template renders it first either way (ChatML, Qwen, SmolLM2), and nothing
    where tools change the text before it (Llama 3.x). Before, every model's key shared nothing."""
    messages = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "What is owed?"}]
    plain, tooled = (
        {"model": model, "messages": messages},
        {"model": model, "messages": messages, "tools": [LOOKUP_TOOL]},
    )
    template_shares = shared_chars(rendered(template, plain), rendered(template, tooled))
    builder = KeyBuilder(KeySettings())
    a = builder.build("chat", plain, route_id="a").blocks
    b = builder.build("chat", tooled, route_id="b").blocks
    key_shares = shared(a, b) * KeySettings().block_chars
    if template_shares >= len(LONG_SYSTEM):
        assert key_shares >= len(LONG_SYSTEM) - 2 * KeySettings().block_chars
    else:
        assert template_shares < 200 and key_shares == 0


def test_tools_before_system_is_a_knob() -> None:
    messages = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "hi"}]
    body = {"model": "my-served-name", "messages": messages}
    for patterns, shares in (([], True), (["my-served-*"], False)):
        builder = KeyBuilder(KeySettings(tools_before_system=patterns))
        a = builder.build("chat", body, route_id="a").blocks
        b = builder.build("chat", {**body, "tools": [LOOKUP_TOOL]}, route_id="b").blocks
        assert (a[0] == b[0]) is shares


def test_a_body_given_as_another_mapping_is_keyed_as_its_dict() -> None:
    """Bodies are JSON objects (dicts) on the request path, read as dicts; any other ``Mapping``, messages
    and reply included, gives the same request as its dict copy."""
    from types import MappingProxyType

    messages = [
        {"role": "system", "content": "s" * 40, "name": "sys"},
        {"role": "user", "content": "q" * 40},
        {"role": "assistant", "content": "<think>why</think>a" * 5, "reasoning_content": "r"},
        {"role": "user", "content": "again" * 10},
    ]
    tools = [{"type": "function", "function": {"name": "f"}}]
    extra = {"tool_choice": "none", "lora_path": "adapter", "cache_salt": "salt", "max_tokens": 7}
    body = chat(messages, tools=tools, add_generation_prompt=False, **extra)
    other = MappingProxyType({**body, "messages": [MappingProxyType(m) for m in messages]})
    reply = {"role": "assistant", "content": "done", "reasoning_content": "thought"}
    for made in (KEYS.build("chat", body, route_id="r"), KEYS.build("chat", other, route_id="r")):
        assert made == KEYS.build("chat", body, route_id="r")
    assert KEYS.extension("chat", other, MappingProxyType(reply)) == KEYS.extension("chat", body, reply)
    assert KEYS.build("chat", other, route_id="r").output_tokens_hint == 7
