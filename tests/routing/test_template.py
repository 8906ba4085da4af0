"""Exact mode: keys from the model's own chat template and tokenizer (model directories from the GGUF)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefix_router.node.config import load_config
from prefix_router.routing.keys import KeyBuilder
from prefix_router.routing.settings import KeySettings
from prefix_router.routing.template import ChatTemplate, TemplateError
from prefix_router.settings import ConfigError
from support.bodies import chat

SYSTEM = {"role": "system", "content": "You run the storage cluster. Follow the runbook to the letter. " * 20}
TOOL = {
    "type": "function",
    "function": {
        "name": "get",
        "description": "Reads a thing.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def builder(path: Path, **knobs: Any) -> KeyBuilder:
    return KeyBuilder(KeySettings(mode="template", templates={"m": str(path)}, **knobs))


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_keys_are_blocks_of_the_rendered_token_ids(model_dirs: dict[str, Any]) -> None:
    path = model_dirs["qwen2.5"].path
    template = ChatTemplate(path)
    body = chat([SYSTEM, {"role": "user", "content": "Which volumes are degraded?"}], tools=[TOOL])
    req = builder(path).build("chat", body, route_id="r")
    ids = template.chat_ids(body)
    assert req.exact and req.key_tokens == len(ids) and len(req.blocks) == len(ids) // 16
    text = template.render(body)
    assert text.startswith("<|im_start|>system\n" + SYSTEM["content"] + "\n\n# Tools")
    assert '{"type": "function", "function": {"name": "get"' in text  # tojson keeps the client's key order
    assert text.endswith("<|im_start|>assistant\n")


def test_a_pair_shares_exactly_the_blocks_of_its_common_token_prefix(model_dirs: dict[str, Any]) -> None:
    path = model_dirs["qwen2.5"].path
    keys, template = builder(path), ChatTemplate(path)
    a = chat([SYSTEM, {"role": "user", "content": "first question"}], tools=[TOOL])
    b = chat([SYSTEM, {"role": "user", "content": "another one"}], tools=[TOOL])
    ids_a, ids_b = template.chat_ids(a), template.chat_ids(b)
    common = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y)
    blocks_a = keys.build("chat", a, route_id="a").blocks
    blocks_b = keys.build("chat", b, route_id="b").blocks
    assert shared(blocks_a, blocks_b) == common // 16


def test_template_kwargs_change_the_text_where_the_template_uses_them(model_dirs: dict[str, Any]) -> None:
    path = model_dirs["qwen3"].path
    keys = builder(path)
    msgs = [SYSTEM, {"role": "user", "content": "q " * 100}]
    plain = keys.build("chat", chat(msgs), route_id="a")
    fast = keys.build("chat", chat(msgs, chat_template_kwargs={"enable_thinking": False}), route_id="b")
    assert fast.key_tokens > plain.key_tokens  # the empty think block, at the end
    assert shared(plain.blocks, fast.blocks) >= len(plain.blocks) - 1


def test_the_extension_stops_before_the_end_of_turn_token(model_dirs: dict[str, Any]) -> None:
    path = model_dirs["smollm2"].path
    keys, template = builder(path), ChatTemplate(path)
    body = chat([SYSTEM, {"role": "user", "content": "hello"}])
    reply = {"role": "assistant", "content": "Hi there, the cluster is healthy today. " * 5}
    req = keys.build("chat", body, route_id="r")
    ext = keys.extend(req, "chat", body, reply)
    rendered = template.chat_ids(body, reply=reply)
    end = rendered.index(template.eos_id, req.key_tokens)
    assert ext[: len(req.blocks)] == req.blocks and len(ext) == end // 16
    nxt = keys.build(
        "chat", chat([*body["messages"], reply, {"role": "user", "content": "thanks"}]), route_id="n"
    )
    assert nxt.blocks[: len(ext)] == ext
    assert keys.extension("chat", body, reply) == ext


def test_the_precise_extension_is_the_next_turn_precise_key_up_to_the_reply_end(
    model_dirs: dict[str, Any],
) -> None:
    keys = builder(model_dirs["smollm2"].path)
    keys.precise_block_tokens = 32  # a worker publishes KV events (engine blocks of 32 tokens)
    body = chat([SYSTEM, {"role": "user", "content": "hello"}], cache_salt="s1")
    reply = {"role": "assistant", "content": "Hi there, the cluster is healthy today. " * 5}
    req = keys.build("chat", body, route_id="r", engine_salt="t")
    ext = keys.precise_extension(req, "chat", body, reply, engine_salt="t")
    assert ext[: len(req.precise_blocks)] == req.precise_blocks and len(ext) > len(req.precise_blocks)
    nxt = keys.build(
        "chat",
        chat([*body["messages"], reply, {"role": "user", "content": "thanks"}], cache_salt="s1"),
        route_id="n",
        engine_salt="t",
    )
    assert nxt.precise_blocks[: len(ext)] == ext  # what the next turn's engine blocks are
    assert keys.precise_extension(req, "chat", body, reply) != ext  # another salt: other blocks
    thinking = {"role": "assistant", "content": "Hi " * 80, "reasoning_content": "let me think " * 40}
    assert keys.precise_extension(req, "chat", body, thinking) == ()


def test_a_reply_with_reasoning_extends_nothing(model_dirs: dict[str, Any]) -> None:
    keys = builder(model_dirs["qwen3"].path)
    body = chat([SYSTEM, {"role": "user", "content": "hello"}])
    req = keys.build("chat", body, route_id="r")
    for reply in (
        {"role": "assistant", "content": "Hi " * 80, "reasoning_content": "let me think " * 40},
        {"role": "assistant", "content": "<think>\nhmm " * 40 + "</think>\n\nHi " * 80},
    ):
        assert keys.extend(req, "chat", body, reply) == req.blocks


def test_refused_or_custom_templates_fall_back_to_the_default_key(model_dirs: dict[str, Any]) -> None:
    keys = builder(model_dirs["mistral-v0.3"].path)
    call = {"id": "short", "type": "function", "function": {"name": "get", "arguments": "{}"}}
    refused = chat(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    )
    with pytest.raises(TemplateError):
        ChatTemplate(model_dirs["mistral-v0.3"].path).render(refused)
    assert not keys.build("chat", refused, route_id="r").exact
    custom = chat([{"role": "user", "content": "x"}], chat_template="{{ messages[0].content }}")
    assert not keys.build("chat", custom, route_id="c").exact
    assert not keys.build("chat", {**custom, "model": "other"}, route_id="o").exact  # not an exact model


def test_images_are_image_tokens_named_by_their_url(model_dirs: dict[str, Any]) -> None:
    keys = builder(model_dirs["smollm2"].path, image_tokens=100)

    def with_image(url: str) -> Any:
        part = {"type": "image_url", "image_url": {"url": url}}
        text = {"type": "text", "text": "describe it " * 20}
        return keys.build("chat", chat([SYSTEM, {"role": "user", "content": [part, text]}]), route_id=url)

    a, b, again = with_image("a.png"), with_image("b.png"), with_image("a.png")
    text_only = keys.build(
        "chat", chat([SYSTEM, {"role": "user", "content": "describe it " * 20}]), route_id="t"
    )
    assert a.blocks == again.blocks and a.blocks != b.blocks
    assert a.key_tokens - text_only.key_tokens in range(100, 103)  # plus the newline joining the parts


def test_completions_prompts_are_tokenized_like_chat(model_dirs: dict[str, Any]) -> None:
    path = model_dirs["smollm2"].path
    keys, template = builder(path), ChatTemplate(path)
    text = template.render(chat([SYSTEM, {"role": "user", "content": "hello"}]))
    by_chat = keys.build("chat", chat([SYSTEM, {"role": "user", "content": "hello"}]), route_id="c")
    by_text = keys.build("completions", {"model": "m", "prompt": text}, route_id="t")
    by_ids = keys.build("completions", {"model": "m", "prompt": template.chat_ids(
        chat([SYSTEM, {"role": "user", "content": "hello"}]))}, route_id="i")  # fmt: skip
    assert by_chat.blocks == by_text.blocks == by_ids.blocks


def test_templates_are_checked_at_config_load(tmp_path: Path, model_dirs: dict[str, Any]) -> None:
    good = str(model_dirs["smollm2"].path)
    assert load_config(
        env={}, overrides={"routing.keys.mode": "template", "routing.keys.templates": {"m": good}}
    ).routing.keys.templates == {"m": good}
    with pytest.raises(ConfigError, match=r"templates"):
        load_config(
            env={},
            overrides={"routing.keys.mode": "template", "routing.keys.templates": {"m": str(tmp_path)}},
        )
    (tmp_path / "tokenizer.json").write_text((model_dirs["smollm2"].path / "tokenizer.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "x"}))
    with pytest.raises(TemplateError, match="no chat_template"):
        ChatTemplate(tmp_path)


def test_the_sandbox_refuses_unsafe_templates(tmp_path: Path, model_dirs: dict[str, Any]) -> None:
    (tmp_path / "tokenizer.json").write_text((model_dirs["smollm2"].path / "tokenizer.json").read_text())
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": evil}))
    with pytest.raises(TemplateError, match="SecurityError"):
        ChatTemplate(tmp_path).render(chat([{"role": "user", "content": "x"}]))


def test_text_the_tokenizer_refuses_falls_back_to_the_default_key(model_dirs: dict[str, Any]) -> None:
    keys = builder(model_dirs["smollm2"].path)
    req = keys.build("chat", chat([{"role": "user", "content": "lone \ud800 surrogate"}]), route_id="r")
    assert (
        not req.exact
        and req.blocks
        == KeyBuilder(KeySettings())
        .build("chat", chat([{"role": "user", "content": "lone \ud800 surrogate"}]), route_id="r")
        .blocks
    )
