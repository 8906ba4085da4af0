"""The oracle: how many prompt tokens an engine would really reuse, from a real chat template and tokenizer.

Written apart from the router's exact mode (``routing/template.py``) on purpose, so that the benchmark checks
it rather than repeats it. A request is rendered the way transformers' ``apply_chat_template`` renders it
(sandboxed jinja2, ``tojson`` keeping key order, ``raise_exception``, ``strftime_now``, the special tokens),
with the request prepared as vLLM prepares it (text parts joined with a newline, tool-call arguments as
objects); an image is ``image_tokens`` tokens named by its URL (what a multimodal processor feeds the
engine). After a reply, the engine holds the prompt's tokens then the tokens the model generated, written
as the template writes the reply in the current turn (with its reasoning) and tokenized on their own, up
to the end-of-turn token (sampled, never computed). The truth for a pair is the longest common token
prefix of what the engine holds and the second request's tokens.
"""

from __future__ import annotations

import json
import zlib
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

_IMAGE = "\x00image:"


def _env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, sort_keys=False, **kw)

    def fail(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = fail
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for part in content:
        if part.get("type") == "text":
            pieces.append(part["text"])
        else:
            pieces.append(f"{_IMAGE}{part['image_url']['url']}\x00")
    return "\n".join(pieces)


def _message(msg: dict[str, Any]) -> dict[str, Any]:
    out = {**msg, "content": _text(msg.get("content"))}
    if msg.get("tool_calls"):
        out["tool_calls"] = [
            {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in msg["tool_calls"]
        ]
    return out


class Oracle:
    """One model directory's template and tokenizer, used as the ground truth."""

    def __init__(self, directory: Path, image_tokens: int) -> None:
        from tokenizers import Tokenizer

        config = json.loads((directory / "tokenizer_config.json").read_text())
        self.template = _env().from_string(config["chat_template"])
        self.tokens = {k: config[k] for k in ("bos_token", "eos_token")}
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.image_tokens = image_tokens

    def text(self, body: dict[str, Any], reply: dict[str, Any] | None = None) -> str:
        messages = [_message(m) for m in [*body["messages"], *([reply] if reply else [])]]
        context = {
            **self.tokens,
            **(body.get("chat_template_kwargs") or {}),
            "messages": messages,
            "tools": body.get("tools"),
            "documents": body.get("documents"),
            "add_generation_prompt": reply is None and body.get("add_generation_prompt", True),
        }
        if "reasoning_effort" in body:
            context["reasoning_effort"] = body["reasoning_effort"]
        return str(self.template.render(**context))

    def ids(self, text: str) -> list[int]:
        out: list[int] = []
        for i, piece in enumerate(text.split(_IMAGE)):
            if i:
                url, _, piece = piece.partition("\x00")
                out += [zlib.crc32(url.encode()) | 0x8000_0000] + [0xFFFF_FFFE] * (self.image_tokens - 1)
            out += self.tokenizer.encode(piece, add_special_tokens=False).ids
        return out

    def held(self, body: dict[str, Any], reply: dict[str, Any] | None) -> list[int]:
        """The tokens the engine holds after serving ``body`` (and generating ``reply``)."""
        prompt = self.text(body)
        held = self.ids(prompt)
        if reply is None:
            return held
        written = self.text(body, reply)
        generated = written[len(prompt) :] if written.startswith(prompt) else _text(reply.get("content"))
        eos = self.tokens["eos_token"]
        return held + self.ids(generated.split(eos, 1)[0] if eos else generated)

    def truth(
        self, first: dict[str, Any], reply: dict[str, Any] | None, second: dict[str, Any]
    ) -> tuple[int, int]:
        """``(shared tokens, tokens of the second prompt)``."""
        held, nxt = self.held(first, reply), self.ids(self.text(second))
        n = 0
        for a, b in zip(held, nxt, strict=False):
            if a != b:
                break
            n += 1
        return n, len(nxt)
