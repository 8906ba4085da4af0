"""Routing-key fidelity through the real HTTP proxy (issue 12, rows 1-3 of its table).

Two fake engines behind ``serve``; the router's predicted cached tokens for a request come back in
``x-prefix-router-prefix-match``. Each test sends a first request, then a second one that differs the way
the row says, and checks the prediction against what chat templates render.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from support.routers import RouterHandle

MATCH = "x-prefix-router-prefix-match"
SYSTEM = "You are the operations assistant of a storage cluster. Follow the runbook. " * 270  # ~20k chars
SYSTEM_TOKENS = len(SYSTEM) // 4


def tool(name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name}: " + "looks a thing up in the inventory. " * 20,
            "parameters": {"type": "object", "properties": params, "required": list(params)},
        },
    }


TOOLS = [
    tool("get_volume", {"volume_id": {"type": "string", "description": "the volume"}}),
    tool(
        "list_alerts",
        {"since": {"type": "integer", "description": "epoch seconds"}, "limit": {"type": "integer"}},
    ),
]
OTHER_TOOLS = [tool("restart_node", {"node": {"type": "string", "description": "the node to restart"}})]


def body(**extra: Any) -> dict[str, Any]:
    question = "Which volumes are degraded, and which alerts fired on their nodes this week? " * 8
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return {"model": "m", "messages": messages, **extra}


VENDOR_FIELDS = ("chat_template_kwargs", "chat_template", "documents")  # vLLM's, sent as extra_body


async def predicted(router: RouterHandle, payload: dict[str, Any]) -> int:
    client = router.openai()
    known = {k: v for k, v in payload.items() if k not in VENDOR_FIELDS}
    extra = {k: v for k, v in payload.items() if k in VENDOR_FIELDS}
    raw = await client.chat.completions.with_raw_response.create(**known, extra_body=extra or None)
    return int(raw.headers[MATCH])


@pytest.fixture
async def router(fake_engine: Any, start_router: Any) -> RouterHandle:
    engines = [await fake_engine(n, reply="ok") for n in ("a", "b")]
    handle: RouterHandle = await start_router(*engines)
    return handle


async def test_row1_the_system_prompt_is_shared_whatever_the_tools(router: RouterHandle) -> None:
    """Templates render the system text before any tool text: another tool list shares the system prompt
    (the old key put tools first and predicted 0)."""
    await predicted(router, body(tools=TOOLS))
    match = await predicted(router, body(tools=OTHER_TOOLS))
    assert SYSTEM_TOKENS - 32 <= match <= SYSTEM_TOKENS + 16


async def test_row2_tool_schemas_keep_the_clients_key_order(router: RouterHandle) -> None:
    """``tojson`` does not sort keys: the same tools in another key order render other text, so only the
    part before the tools is shared (the old key sorted keys and predicted the whole prompt)."""
    first = await predicted(router, body(tools=TOOLS))
    assert first == 0
    full = await predicted(router, body(tools=TOOLS))
    reordered = copy.deepcopy(TOOLS)
    reordered[0]["function"] = dict(reversed(list(reordered[0]["function"].items())))
    match = await predicted(router, body(tools=reordered))
    assert full > SYSTEM_TOKENS + 100  # an identical repeat matches through the tools
    assert SYSTEM_TOKENS - 32 <= match <= SYSTEM_TOKENS + 16


@pytest.mark.parametrize(
    "extra",
    [
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"reasoning_effort": "high"},
        {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
        {"documents": [{"title": "runbook", "text": "Drain the node first. " * 50}]},
    ],
    ids=["chat_template_kwargs", "reasoning_effort", "chat_template", "documents"],
)
async def test_row3_fields_that_change_the_prompt_change_the_prediction(
    router: RouterHandle, extra: dict[str, Any]
) -> None:
    """A field that changes the rendered prompt is no longer predicted as the full prompt: at the point
    where it changes the text (documents: after the system prompt), or from the start when no template
    fixes that point (the old key ignored these fields and predicted everything)."""
    await predicted(router, body())
    full = await predicted(router, body())
    match = await predicted(router, body(**extra))
    assert full >= SYSTEM_TOKENS + 150
    if "documents" in extra:
        assert SYSTEM_TOKENS - 32 <= match <= SYSTEM_TOKENS + 16
    else:
        assert match == 0


SAMPLING = {
    "temperature": 0.3,
    "top_p": 0.5,
    "max_tokens": 7,
    "max_completion_tokens": 9,
    "stream": True,
    "seed": 11,
    "n": 2,
    "stop": ["\n\n"],
    "user": "someone",
}


async def test_sampling_fields_give_identical_keys(router: RouterHandle) -> None:
    """Bodies that differ only in sampling fields have the very same key: the second one matches all of
    the first one's blocks, field by field and all together."""
    keys = router.state.router.keys
    plain = keys.build("chat", body(tools=TOOLS), route_id="p")
    for name, value in [*SAMPLING.items(), ("all", None)]:
        extra = SAMPLING if name == "all" else {name: value}
        other = keys.build("chat", body(tools=TOOLS, **extra), route_id=name)
        assert (other.blocks, other.key_tokens, other.hash_key) == (
            plain.blocks,
            plain.key_tokens,
            plain.hash_key,
        ), name
    await predicted(router, body(tools=TOOLS))
    full = await predicted(router, body(tools=TOOLS))
    sampled = {k: v for k, v in SAMPLING.items() if k not in ("stream", "n")}  # the client reads one answer
    assert await predicted(router, body(tools=TOOLS, **sampled)) == full


async def test_exact_mode_predicts_whole_pages_of_the_rendered_tokens(
    fake_engine: Any, start_router: Any, model_dirs: dict[str, Any]
) -> None:
    """With the model's template and tokenizer (a body over 8 KiB: keyed in a worker thread), a repeat is
    predicted at exactly its full pages of rendered tokens, and another tool list at the pages before the
    tools."""
    from prefix_router.routing.template import ChatTemplate

    path = model_dirs["qwen2.5"].path
    engines = [await fake_engine(n, reply="ok") for n in ("a", "b")]
    router = await start_router(
        *engines, settings={"routing.keys.mode": "template", "routing.keys.templates": {"m": str(path)}}
    )
    template = ChatTemplate(path)
    ids = template.chat_ids(body(tools=TOOLS))
    other = template.chat_ids(body(tools=OTHER_TOOLS))
    common = next(i for i, (x, y) in enumerate(zip(ids, other, strict=False)) if x != y)
    assert await predicted(router, body(tools=TOOLS)) == 0
    assert await predicted(router, body(tools=TOOLS)) == len(ids) // 16 * 16
    assert await predicted(router, body(tools=OTHER_TOOLS)) == common // 16 * 16
