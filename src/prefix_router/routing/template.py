"""Exact mode: render a chat request with the model's own chat template and tokenize it, as the engine does.

A local model directory holds ``tokenizer.json`` (read with ``tokenizers``) and ``tokenizer_config.json``
with its ``chat_template`` (a string, or named templates where ``tool_use`` is taken when the request has
tools, as transformers does; a ``chat_template.jinja`` file wins over both) and special tokens
(``bos_token``, ``eos_token``, ...). Nothing is ever fetched from a hub.

Rendering follows transformers' ``apply_chat_template``: jinja2's ``ImmutableSandboxedEnvironment`` with
``trim_blocks``/``lstrip_blocks`` and the ``loopcontrols`` extension; ``tojson`` that keeps key order
(``ensure_ascii=False``, optional ``indent``); ``raise_exception``; ``strftime_now``; a pass-through
``{% generation %}`` block; the special tokens as variables. The request is prepared as vLLM prepares it:
text parts of a content array joined with a newline (or passed as parts to templates that iterate over
``content``), tool-call ``arguments`` parsed from their JSON string, ``tools``, ``documents``,
``add_generation_prompt``, ``continue_final_message`` (the prompt ends inside the final message),
``chat_template_kwargs`` and ``reasoning_effort`` passed to the template. The text is tokenized without
adding special tokens (the template writes them). An image becomes ``image_tokens`` placeholder ids named
by a hash of its URL, since the engine's multimodal processor (not the template) expands it.

Knobs (``routing.keys``; mode ``template`` or ``events``): ``templates`` (model name -> directory),
``image_tokens``, ``tool_choice_none_drops_tools`` (vLLM's ``--exclude-tools-when-tool-choice-none``).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import orjson
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from prefix_router.routing.canonical import MEDIA, content_text, messages_of
from prefix_router.routing.hashing import hash_bytes
from prefix_router.routing.types import InvalidRequest

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")
_MEDIA_RE = re.compile(f"{MEDIA}([0-9a-f]{{16}}){MEDIA}")
_ITERATES_CONTENT = re.compile(r"for\s+\w+\s+in\s+\w+(\[['\"]content['\"]\]|\.content)")
_MEDIA_ID = 0x8000_0000  # placeholder ids live above every real vocabulary id
_MEDIA_FILL = 0xFFFF_FFFE


class TemplateError(Exception):
    """A model directory that cannot be used, or a request its template refuses."""


class _Generation(Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` (marks assistant text): rendered as is."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's declared class attribute)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render", [])
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller: Callable[[], str]) -> str:
        return caller()


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
    sort_keys: bool = False,
) -> str:  # fmt: skip
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TemplateError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise TemplateError(f"{path}: expected a JSON object")
    return data


def _templates(directory: Path, config: Mapping[str, Any]) -> dict[str, str]:
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return {"default": jinja_file.read_text(encoding="utf-8")}
    raw = config.get("chat_template")
    if isinstance(raw, str):
        return {"default": raw}
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
        found = {k: v for k, v in named.items() if isinstance(k, str) and isinstance(v, str)}
        if "default" in found:
            return found
    raise TemplateError(f"{directory}: no chat_template in tokenizer_config.json or chat_template.jinja")


class ChatTemplate:
    """One model's chat template and tokenizer: request bodies -> the token ids the engine will see."""

    def __init__(
        self, directory: str | Path, image_tokens: int = 576, drop_tools_on_none: bool = False
    ) -> None:
        from tokenizers import Tokenizer  # optional dependency (the ``exact`` extra)

        path = Path(directory)
        config = _read_json(path / "tokenizer_config.json")
        try:
            self._tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as exc:
            raise TemplateError(f"{path / 'tokenizer.json'}: {exc}") from None
        env = _environment()
        sources = _templates(path, config)
        try:
            self._compiled = {name: env.from_string(src) for name, src in sources.items()}
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"{path}: chat template line {exc.lineno}: {exc.message}") from None
        self._parts = {name: bool(_ITERATES_CONTENT.search(src)) for name, src in sources.items()}
        self.special = {n: t for n in SPECIAL_TOKEN_NAMES if (t := _token_text(config.get(n))) is not None}
        eos = self.special.get("eos_token")
        self.eos_id: int | None = self._tokenizer.token_to_id(eos) if eos else None
        self.image_tokens = image_tokens
        self.drop_tools_on_none = drop_tools_on_none

    # ------------------------------------------------------------ rendering

    def render(
        self, body: Mapping[str, Any], reply: Mapping[str, Any] | None = None, generation_prompt: bool = True
    ) -> str:
        """The prompt text; with ``reply``, the conversation as the next turn carries it (no generation
        prompt)."""
        tools = self._tools(body)
        name = "tool_use" if tools and "tool_use" in self._compiled else "default"
        messages = [*messages_of(body), *([reply] if reply is not None else [])]
        prepared = [_prepare(m, i, self._parts[name]) for i, m in enumerate(messages)]
        cont = reply is None and body.get("continue_final_message") is True
        add = generation_prompt and reply is None and body.get("add_generation_prompt", True) is not False
        context: dict[str, Any] = {
            **self.special,
            **_kwargs(body),
            "messages": prepared,
            "tools": tools,
            "documents": body.get("documents"),
            "add_generation_prompt": add and not cont,
        }
        if isinstance(body.get("reasoning_effort"), str):
            context.setdefault("reasoning_effort", body["reasoning_effort"])
        try:
            text = self._compiled[name].render(**context)
        except Exception as exc:  # the template's own refusals (raise_exception) and its bugs
            raise TemplateError(f"chat template: {type(exc).__name__}: {exc}") from None
        return _cut_final(text, prepared[-1]) if cont else text

    def _tools(self, body: Mapping[str, Any]) -> list[Any] | None:
        tools = body.get("tools")
        if not tools or (self.drop_tools_on_none and body.get("tool_choice") == "none"):
            return None
        if not isinstance(tools, list):
            raise InvalidRequest("'tools' must be an array", "tools")
        return tools

    # ------------------------------------------------------------ tokens

    def encode(self, text: str, special: bool = False) -> list[int]:
        """Token ids of ``text``; images (media markers) become ``image_tokens`` placeholder ids."""
        if MEDIA not in text:
            return list(self._tokenizer.encode(text, add_special_tokens=special).ids)
        ids: list[int] = []
        pos = 0
        for match in _MEDIA_RE.finditer(text):
            ids += self._tokenizer.encode(text[pos : match.start()], add_special_tokens=False).ids
            ids += media_ids(match.group(1), self.image_tokens)
            pos = match.end()
        ids += self._tokenizer.encode(text[pos:], add_special_tokens=False).ids
        return ids

    def chat_ids(
        self, body: Mapping[str, Any], reply: Mapping[str, Any] | None = None, generation_prompt: bool = True
    ) -> list[int]:
        return self._safe_encode(self.render(body, reply, generation_prompt), False)

    def completion_ids(self, prompt: str) -> list[int]:
        """A completions prompt, with the special tokens the tokenizer adds (BOS), as engines do."""
        return self._safe_encode(prompt, True)

    def _safe_encode(self, text: str, special: bool) -> list[int]:
        try:
            return self.encode(text, special)
        except Exception as exc:  # e.g. lone surrogates, which the Rust tokenizer refuses
            raise TemplateError(f"tokenizer: {type(exc).__name__}") from None


def media_ids(hex_digest: str, count: int) -> list[int]:
    """``count`` placeholder ids for one image, the first naming it."""
    if count <= 0:
        return []
    first = _MEDIA_ID | (hash_bytes(hex_digest.encode()) & 0x7FFF_FFFF)
    return [first, *([_MEDIA_FILL] * (count - 1))]


def _kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise InvalidRequest("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    return {k: v for k, v in kwargs.items() if isinstance(k, str) and k != "messages"}


def _prepare(msg: Any, i: int, as_parts: bool) -> dict[str, Any]:
    """One message as vLLM hands it to the template."""
    if not isinstance(msg, Mapping):
        raise InvalidRequest("each message must be an object", f"messages[{i}]")
    out = dict(msg)
    content = msg.get("content")
    if isinstance(content, list) and as_parts:
        out["content"] = [_part(p, f"messages[{i}].content[{j}]") for j, p in enumerate(content)]
    else:
        out["content"] = content_text(content, f"messages[{i}].content")
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [_call(c) for c in calls]
    return out


def _part(part: Any, param: str) -> dict[str, Any]:
    if isinstance(part, Mapping) and part.get("type") == "text":
        return dict(part)
    return {"type": "text", "text": content_text([part], param)}


def _call(call: Any) -> Any:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    args = function.get("arguments")
    if isinstance(args, str):
        with contextlib.suppress(orjson.JSONDecodeError):  # templates then print the string as is
            function["arguments"] = orjson.loads(args)
    return {**call, "function": function}


def _cut_final(text: str, final: Mapping[str, Any]) -> str:
    """``continue_final_message``: the text ends where the final message's content ends."""
    content = final.get("content")
    if not isinstance(content, str) or not content.strip():
        return text
    at = text.rfind(content.strip())
    if at < 0:
        raise TemplateError("continue_final_message: the final message is not in the rendered text")
    return text[: at + len(content.strip())]


def load_templates(
    models: Mapping[str, str], image_tokens: int, drop_tools_on_none: bool
) -> dict[str, ChatTemplate]:
    """One ``ChatTemplate`` per configured model (fails at start-up, not per request)."""
    return {m: ChatTemplate(d, image_tokens, drop_tools_on_none) for m, d in models.items()}
