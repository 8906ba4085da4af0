"""The fidelity corpus: deterministic request pairs whose shared prompt prefix an engine would reuse.

Each ``Case`` is a first request, optionally the reply it got (the second request then continues the
conversation), and a second request. Categories:

- ``chat``: the next turn of a multi-turn chat; the same system prompt with other questions; an identical
  repeat; another system prompt;
- ``agent``: the same system prompt with other tools, with the same tools in another key order, with and
  without tools; the next step of a tool loop (a tool call, then its result);
- ``reasoning``: the next turn after a reply that reasoned; a tool loop whose reasoning is sent back;
- ``multimodal``: content parts (text parts, images) with the same or another image;
- ``kwargs``: ``chat_template_kwargs``, ``reasoning_effort``, ``documents``, ``add_generation_prompt``,
  ``tool_choice: none`` added to an otherwise identical request.

Everything is drawn from ``random.Random`` seeded by the case's name: the same size gives the same corpus.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prefix_router.lab.workloads.text import rng_for

CATEGORIES = ("chat", "agent", "reasoning", "multimodal", "kwargs")
_WORD_TEXT = """
the of and to in is that for it as with be by on not this are or from at which but have an they you
were their one all we can her has there been if more when will would who so no time data model
system cache token request server memory engine batch prefix route worker query answer result value
table index block queue graph node layer vector matrix policy latency throughput network stream
signal customer product service account payment invoice contract review summary chapter section
figure example method function variable library module package version release feature support issue
change update deploy cluster region storage volume backup restore monitor alert metric dashboard
trace event configuration authentication authorization infrastructure availability consistency
replication transaction serialization recommendation interpretation approximately significantly
respectively Kubernetes PostgreSQL JSON HTTP API SDK UTF-8 OAuth gRPC TLS
"""
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True, slots=True)
class Case:
    category: str
    name: str
    first: dict[str, Any]
    second: dict[str, Any]
    reply: dict[str, Any] | None = None  # the reply to ``first`` as the API returned it
    tags: tuple[str, ...] = field(default=())


def sentence(rng: random.Random) -> str:
    words = rng.choices(_WORDS, k=rng.randint(6, 18))
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), str(rng.randint(2, 99_999)))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", ".", ".", "?", "!", ":"])


def prose(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        para = " ".join(sentence(rng) for _ in range(rng.randint(2, 6)))
        out.append(para)
        size += len(para) + 2
    return "\n\n".join(out)


def tool(rng: random.Random, i: int) -> dict[str, Any]:
    props = {
        f"{rng.choice(_WORDS[40:120]).lower()}_{j}": {
            "type": rng.choice(["string", "integer", "boolean", "number"]),
            "description": sentence(rng),
        }
        for j in range(rng.randint(2, 6))
    }
    return {
        "type": "function",
        "function": {
            "name": f"tool_{i}_{rng.choice(_WORDS[40:120]).lower()}",
            "description": prose(rng, rng.randint(80, 400)),
            "parameters": {"type": "object", "properties": props, "required": sorted(props)[:1]},
        },
    }


def reordered(value: Any) -> Any:
    """The same JSON with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


def _system(rng: random.Random, chars: int) -> dict[str, Any]:
    return {"role": "system", "content": prose(rng, chars)}


def _user(rng: random.Random, chars: int = 300) -> dict[str, Any]:
    return {"role": "user", "content": prose(rng, rng.randint(chars // 2, chars))}


def _assistant(rng: random.Random, chars: int = 400) -> dict[str, Any]:
    return {"role": "assistant", "content": prose(rng, rng.randint(chars // 2, chars))}


def _call(rng: random.Random, tools: list[dict[str, Any]], n: int) -> dict[str, Any]:
    fn = rng.choice(tools)["function"]
    args = {k: rng.randint(1, 99) for k in fn["parameters"]["properties"]}
    return {
        "id": f"call{n:05d}",  # nine characters, as Mistral's templates require
        "type": "function",
        "function": {"name": fn["name"], "arguments": _dumps(args)},
    }


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value)


def _body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, **extra}


# ---------------------------------------------------------------- categories


def chat_cases(rng: random.Random, system_chars: int) -> Iterator[Case]:
    system = _system(rng, system_chars)
    history = [system, _user(rng)]
    for turn in range(3):
        reply = _assistant(rng)
        nxt = [*history, reply, _user(rng)]
        yield Case("chat", f"next-turn-{turn}", _body(history), _body(nxt), reply)
        history = nxt
    yield Case("chat", "same-system", _body([system, _user(rng)]), _body([system, _user(rng)]))
    yield Case("chat", "repeat", _body(history), _body(history))
    yield Case("chat", "other-system", _body([_system(rng, 400), _user(rng)]), _body([system, _user(rng)]))
    yield Case("chat", "no-system", _body(history[1:4]), _body(history[1:]))


def agent_cases(rng: random.Random, system_chars: int) -> Iterator[Case]:
    system = _system(rng, system_chars)
    tools = [tool(rng, i) for i in range(rng.randint(3, 6))]
    others = [tool(rng, i + 10) for i in range(3)]
    question = _user(rng)
    yield Case(
        "agent",
        "other-tools",
        _body([system, question], tools=tools),
        _body([system, _user(rng)], tools=others),
    )
    yield Case("agent", "tool-key-order", _body([system, question], tools=tools),
               _body([system, question], tools=reordered(tools)))  # fmt: skip
    yield Case("agent", "tools-added", _body([system, question]), _body([system, question], tools=tools))
    history = [system, question]
    for step in range(3):
        call = {"role": "assistant", "content": None, "tool_calls": [_call(rng, tools, step)]}
        result = {"role": "tool", "tool_call_id": f"call{step:05d}", "content": prose(rng, 600)}
        nxt = [*history, call, result]
        yield Case("agent", f"tool-loop-{step}", _body(history, tools=tools), _body(nxt, tools=tools), call)
        history = nxt
    answer = _assistant(rng)
    yield Case("agent", "answer-then-user", _body(history, tools=tools),
               _body([*history, answer, _user(rng)], tools=tools), answer)  # fmt: skip


def reasoning_cases(rng: random.Random, system_chars: int) -> Iterator[Case]:
    system = _system(rng, system_chars)
    history = [system, _user(rng)]
    reply = {**_assistant(rng), "reasoning_content": prose(rng, 800)}
    sent_back = {"role": "assistant", "content": reply["content"]}
    yield Case("reasoning", "next-turn", _body(history), _body([*history, sent_back, _user(rng)]), reply)
    inline = {
        "role": "assistant",
        "content": "<think>\n" + prose(rng, 600) + "\n</think>\n\n" + prose(rng, 300),
    }
    later = [*history, sent_back, _user(rng)]
    yield Case("reasoning", "inline-think-history", _body([*later, inline]),
               _body([*later, inline, _user(rng)]))  # fmt: skip
    tools = [tool(rng, i) for i in range(3)]
    call = {"role": "assistant", "content": None, "tool_calls": [_call(rng, tools, 7)],
            "reasoning_content": prose(rng, 500)}  # fmt: skip
    result = {"role": "tool", "tool_call_id": "call00007", "content": prose(rng, 400)}
    yield Case("reasoning", "tool-loop-reasoning-sent-back", _body(history, tools=tools),
               _body([*history, call, result], tools=tools), call)  # fmt: skip
    bare = {k: v for k, v in call.items() if k != "reasoning_content"}
    yield Case("reasoning", "tool-loop-reasoning-dropped", _body(history, tools=tools),
               _body([*history, bare, result], tools=tools), call)  # fmt: skip


def multimodal_cases(rng: random.Random, system_chars: int) -> Iterator[Case]:
    system = _system(rng, system_chars)

    def image(name: str) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": f"https://example.invalid/{name}.png"}}

    def text(chars: int) -> dict[str, Any]:
        return {"type": "text", "text": prose(rng, chars)}

    a, b = text(400), text(400)
    yield Case("multimodal", "text-parts", _body([system, {"role": "user", "content": [a, b]}]),
               _body([system, {"role": "user", "content": a["text"] + "\n" + b["text"]}]))  # fmt: skip
    yield Case("multimodal", "same-image", _body([system, {"role": "user", "content": [image("x"), a]}]),
               _body([system, {"role": "user", "content": [image("x"), b]}]))  # fmt: skip
    yield Case("multimodal", "other-image", _body([system, {"role": "user", "content": [image("x"), a]}]),
               _body([system, {"role": "user", "content": [image("y"), a]}]))  # fmt: skip


def kwargs_cases(rng: random.Random, system_chars: int) -> Iterator[Case]:
    system = _system(rng, system_chars)
    msgs = [system, _user(rng), _assistant(rng), _user(rng)]
    tools = [tool(rng, i) for i in range(2)]
    plain = _body(msgs)
    yield Case(
        "kwargs", "enable-thinking-false", plain, _body(msgs, chat_template_kwargs={"enable_thinking": False})
    )
    yield Case("kwargs", "reasoning-effort", plain, _body(msgs, reasoning_effort="high"))
    docs = [{"title": "doc", "text": prose(rng, 500)}]
    yield Case("kwargs", "documents", plain, _body(msgs, documents=docs))
    yield Case("kwargs", "no-generation-prompt", plain, _body(msgs, add_generation_prompt=False))
    yield Case(
        "kwargs", "tool-choice-none", _body(msgs, tools=tools), _body(msgs, tools=tools, tool_choice="none")
    )


_MAKERS = {
    "chat": chat_cases,
    "agent": agent_cases,
    "reasoning": reasoning_cases,
    "multimodal": multimodal_cases,
    "kwargs": kwargs_cases,
}


def corpus(size: str = "small") -> list[Case]:
    """``small``: one conversation per category with a 6,000-character system prompt (the test suite);
    ``full``: four per category, system prompts from 2,000 to 40,000 characters."""
    sizes = [6_000] if size == "small" else [2_000, 8_000, 16_000, 40_000]
    cases: list[Case] = []
    for category, make in _MAKERS.items():
        for chars in sizes:
            rng = rng_for("fidelity", category, chars)
            cases += [
                Case(c.category, f"{c.name}@{chars}", c.first, c.second, c.reply) for c in make(rng, chars)
            ]
    return cases
