"""The default routing key of a chat request: its canonical text, in the order chat templates render it.

Without the model's own chat template (exact mode, ``routing/template.py``), the key follows what the
common templates do (ChatML/Qwen, Llama 3.x, Mistral, SmolLM2, DeepSeek, Granite), so that two requests
share key blocks where their rendered prompts share tokens, and no further:

0. a marker when the request has tools and the model's template writes something for them before the
   system text (Llama 3.x writes "Environment: ipython" into its system header: with and without tools
   never share; ``keys.tools_before_system`` names those models); other templates (ChatML, Qwen,
   SmolLM2) render the system prompt first either way, and requests with and without tools share it;
1. the first message when it is a system (or developer) message;
2. ``tools`` (or legacy ``functions``) serialised in the client's order with the client's key order
   (transformers' ``tojson`` does not sort keys; in token blocks with its very separators), then a marker
   when ``tool_choice`` is ``"none"`` (engines may drop the tools then);
3. ``documents`` (RAG templates render them after the system part and tools);
4. every other message in order: role, then each non-empty field behind a tag: name, reasoning,
   content, tool calls (name and arguments), ``tool_call_id`` (a generated reply adds only its text:
   see ``reply_text``). Content parts are joined with a newline, as vLLM joins text parts; an image is a
   media marker (``\\x1a`` + a hash of its URL + ``\\x1a``) that the key builder values at ``image_tokens``;
   other media by a hash of their data. Reasoning (``reasoning_content``/``reasoning``, or the text
   before ``</think>`` in an assistant's content) counts only after the last user message, because
   reasoning models' templates drop it from earlier turns;
5. a marker when ``add_generation_prompt`` is false or ``continue_final_message`` is true (they change
   the end of the prompt).

Fields that change the prompt at a point no template fixes (``chat_template``, ``chat_template_kwargs``,
``reasoning_effort``, ``add_special_tokens``, ``mm_processor_kwargs``, ``truncate_prompt_tokens``,
completions' ``suffix``) enter the namespace (``prompt_options``). Every other field (sampling,
``stream``, ``n``, ``user``, ``max_tokens``, ...) is never read, so it never changes the key.

Message by message: the key of turn k of a conversation is a prefix of the key of turn k+1 as long as the
rendered prompt of turn k is a prefix of turn k+1's (it is not when turn k carried reasoning after its
last user message: the next user message drops it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import orjson

from prefix_router.routing.hashing import hash_bytes
from prefix_router.routing.types import InvalidRequest

US = "\x1f"  # field separator
RS = "\x1e"  # message separator
GS = "\x1d"  # section marker
MEDIA = "\x1a"  # an image: MEDIA + 16 hex digits + MEDIA, valued at image_tokens by the key builder
_TAGS = ("\x01", "\x02", "\x03", "\x04", "\x05")  # name, reasoning, content, tool calls, tool_call_id
SYSTEM_ROLES = frozenset({"system", "developer"})
# request fields that change the prompt at no fixed point: they enter the namespace
PROMPT_OPTIONS = (
    "chat_template",
    "chat_template_kwargs",
    "reasoning_effort",
    "add_special_tokens",
    "mm_processor_kwargs",
    "truncate_prompt_tokens",
    "suffix",
)


def is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, a JSON object (a dict) first: the ABC check costs 10x the type's."""
    return type(value) is dict or isinstance(value, Mapping)


def as_dict(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` itself when it is a dict (every JSON object is), else a copy: compiled, a dict's ``get``
    is a lookup, a ``Mapping``'s a method call (about five times the instructions)."""
    return value if type(value) is dict else dict(value)


def digest(value: object) -> str:
    data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else orjson.dumps(value)
    return format(hash_bytes(data), "016x")


# the subset that a chat template does not see (exact mode renders the others into the text)
UNRENDERED_OPTIONS = ("add_special_tokens", "mm_processor_kwargs", "truncate_prompt_tokens", "suffix")


def prompt_options(body: Mapping[str, Any], fields: Sequence[str] = PROMPT_OPTIONS) -> str | None:
    """A digest of the fields that change the prompt at no fixed point, or None when none is set."""
    given = as_dict(body)
    present = {k: given[k] for k in fields if given.get(k) is not None}
    if not present:
        return None
    try:
        return format(hash_bytes(orjson.dumps(present, option=orjson.OPT_SORT_KEYS)), "016x")
    except TypeError:
        raise InvalidRequest("prompt options must be JSON values", next(iter(present))) from None


# ---------------------------------------------------------------- content


def _part_text(part: object, param: str) -> str:
    if not isinstance(part, Mapping):
        raise InvalidRequest("content parts must be objects", param)
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequest("a text part needs a string 'text'", param)
        return text
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        return f"{MEDIA}{digest(url)}{MEDIA}"
    if kind == "input_audio":
        audio = part.get("input_audio")
        data = audio.get("data") if isinstance(audio, Mapping) else audio
        return f"<audio:{digest(data)}>"
    return f"<{kind}:{digest(part)}>"


def content_text(content: object, param: str) -> str:
    """A message's content as engines join it: text parts separated by a newline."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join([_part_text(p, f"{param}[{i}]") for i, p in enumerate(content)])
    raise InvalidRequest("'content' must be a string, an array of parts or null", param)


def split_reasoning(content: str) -> tuple[str, str]:
    """``(reasoning, answer)`` of an assistant's content that carries its ``<think>`` text inline."""
    if "</think>" not in content:
        return "", content
    reasoning, _, answer = content.rpartition("</think>")
    return reasoning.replace("<think>", "", 1).strip("\n"), answer.lstrip("\n")


def reasoning_of(message: Mapping[str, Any]) -> str:
    fields = as_dict(message)
    for key in ("reasoning_content", "reasoning"):
        value = fields.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def has_reasoning(message: Mapping[str, Any]) -> bool:
    """Whether a generated reply carried reasoning (which the next turn's template drops); a reasoning
    field that is present but empty counts (the model still wrote a think block)."""
    fields = as_dict(message)
    content = fields.get("content")
    inline = isinstance(content, str) and ("</think>" in content or content.lstrip().startswith("<think>"))
    return inline or any(isinstance(fields.get(k), str) for k in ("reasoning_content", "reasoning"))


# ---------------------------------------------------------------- messages


def _tool_calls_text(calls: object, param: str) -> str:
    if not calls:
        return ""
    if not isinstance(calls, list):
        raise InvalidRequest("'tool_calls' must be an array", param)
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            raise InvalidRequest("each tool call needs a 'function' object", param)
        args = fn.get("arguments")
        out.append(f"{fn.get('name')}({args if isinstance(args, str) else _json(args, param)})")
    return ";".join(out)


def _json(value: object, param: str) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        raise InvalidRequest("expected JSON values", param) from None


def _tojson(value: object, spaced: bool) -> str:
    """A tool schema with its key order kept. ``spaced``: exactly as transformers' ``tojson`` writes it
    (``", "`` and ``": "``), so that a key in token blocks counts about as many tokens as the rendered
    tools; otherwise compact (orjson, ten times faster; in character blocks the fewer bytes only make the
    token estimate lower)."""
    try:
        return json.dumps(value, ensure_ascii=False) if spaced else orjson.dumps(value).decode()
    except (TypeError, ValueError):
        raise InvalidRequest("'tools' must hold JSON values", "tools") from None


def message_text(msg: object, i: int, keep_reasoning: bool) -> str:
    """Role, then each non-empty field behind its tag, then ``RS`` (few separators: a key in token blocks
    then counts about as many tokens per message as templates write). The error's ``param`` is written
    only for an error (it would cost more than the usual message's text)."""
    if not is_mapping(msg):
        raise InvalidRequest("each message must be an object", f"messages[{i}]")
    fields = as_dict(msg)
    role = fields.get("role")
    if not isinstance(role, str):
        raise InvalidRequest("each message needs a string 'role'", f"messages[{i}].role")
    content = fields.get("content")
    if type(content) is not str:
        content = content_text(content, f"messages[{i}].content")
    reasoning = ""
    if role == "assistant":
        inline, content = split_reasoning(content)
        reasoning = (reasoning_of(fields) or inline) if keep_reasoning else ""
    calls = fields.get("tool_calls")
    name, call_id = fields.get("name"), fields.get("tool_call_id")
    parts = [role]
    if isinstance(name, str) and name:
        parts += (_TAGS[0], name)
    if reasoning:
        parts += (_TAGS[1], reasoning)
    if content:
        parts += (_TAGS[2], content)
    if calls:
        parts += (_TAGS[3], _tool_calls_text(calls, f"messages[{i}].tool_calls"))
    if call_id:
        parts += (_TAGS[4], str(call_id))
    parts.append(RS)
    return "".join(parts)


def messages_of(body: Mapping[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' is required and must be a non-empty array", "messages")
    return messages


def last_user_index(messages: Sequence[Any]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if is_mapping(msg) and msg.get("role") == "user":
            return i
    return -1


# ---------------------------------------------------------------- sections


def _tools_text(body: Mapping[str, Any], spaced: bool) -> str:
    given = as_dict(body)
    tools = given.get("tools") or given.get("functions")
    if not tools:
        return ""
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array", "tools")
    text = "\n".join(_tojson(t, spaced) for t in tools)
    none = US + "none" if given.get("tool_choice") == "none" or given.get("function_call") == "none" else ""
    return f"{GS}tools{US}{text}{none}{RS}"


def _documents_text(body: Mapping[str, Any]) -> str:
    documents = body.get("documents")
    if not documents:
        return ""
    return f"{GS}documents{US}{_json(documents, 'documents')}{RS}"


def generation_text(body: Mapping[str, Any]) -> str:
    """The end marker: empty for the default generation prompt."""
    given = as_dict(body)
    add = given.get("add_generation_prompt", True)
    cont = given.get("continue_final_message", False)
    if add is not False and not cont:
        return ""
    return f"{GS}generation{US}{int(bool(add))}{int(bool(cont))}{RS}"


def reply_text(body: Mapping[str, Any], reply: Mapping[str, Any]) -> str:
    """The key text a generated reply adds to ``chat_text(body)``. A reply with tool calls adds only its
    text content: templates re-render calls in their own format (arguments re-serialised), which need not
    be the tokens the model generated."""
    if not reply.get("tool_calls"):
        return message_text(reply, len(messages_of(body)), True)
    text = message_text({**reply, "tool_calls": None}, len(messages_of(body)), True)
    return text[:-1] if _TAGS[2] in text else ""


def chat_text(
    body: Mapping[str, Any],
    extra: Sequence[Mapping[str, Any]] = (),
    spaced_json: bool = False,
    tools_first: bool = True,
) -> str:
    """The canonical text of a chat request (with ``extra`` messages appended); ``spaced_json`` for keys
    in token blocks (see ``_tojson``); ``tools_first``: tools change the text before the system prompt
    (step 0 of the module docstring)."""
    messages = [*messages_of(body), *extra]
    first = messages[0]
    start = 1 if is_mapping(first) and first.get("role") in SYSTEM_ROLES else 0
    last_user = last_user_index(messages)
    head = message_text(first, 0, last_user < 0) if start else ""
    rest = [message_text(m, i, i > last_user) for i, m in enumerate(messages[start:], start)]
    tools = _tools_text(body, spaced_json)
    flag = f"{GS}t{RS}" if tools and tools_first else ""
    return flag + head + tools + _documents_text(body) + "".join(rest) + generation_text(body)
