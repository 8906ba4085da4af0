"""Reading a relayed response for accounting: the assistant reply and the usage, bounded.

Streams are parsed line by line as chunks pass through (the chunks themselves are relayed untouched).
Past ``max_chars`` of generated text, or a line longer than ``max_line``, the reply is given up (the
prefix index then simply does not learn the extension); usage is still picked up from the last chunks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from prefix_router.protocol import Endpoint

MAX_TOOL_CALLS = 64


class ReplyAccumulator:
    """Accumulates choice 0 of a chat or completions reply, from stream deltas or a whole body."""

    def __init__(self, endpoint: Endpoint | None, max_chars: int, max_line: int) -> None:
        self._endpoint = endpoint
        self._max_chars = max_chars
        self._max_line = max_line
        self._pending = bytearray()
        self._parts: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self.chars = 0
        self.reasoned = False  # the reply carried reasoning (its text is not kept: the next turn drops it)
        self.overflow = False
        self.usage_body: dict[str, Any] | None = None

    # ------------------------------------------------------------------ streams

    def feed(self, chunk: bytes) -> None:
        """Consume one relayed SSE chunk (any split of the byte stream)."""
        self._pending += chunk
        if b"\n" not in chunk:
            self._check_line_bound()
            return
        *lines, rest = self._pending.split(b"\n")
        self._pending = bytearray(rest)
        for line in lines:
            self._line(bytes(line))
        self._check_line_bound()

    def _check_line_bound(self) -> None:
        if len(self._pending) > self._max_line:
            self._pending.clear()
            self.overflow = True

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if isinstance(event, dict):
            self.take(event, delta=True)

    # ------------------------------------------------------------------ bodies and events

    def feed_body(self, body: bytes) -> None:
        """Consume a whole JSON response body."""
        try:
            event = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        if isinstance(event, dict):
            self.take(event, delta=False)

    def take(self, event: Mapping[str, Any], delta: bool) -> None:
        if isinstance(event.get("usage"), dict):
            self.usage_body = dict(event)
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice: dict[str, Any] = choices[0]
        if choice.get("index", 0) != 0:
            return
        if self._endpoint == "completions":
            self._text(choice.get("text"))
        elif self._endpoint == "chat":
            self._message(choice.get("delta" if delta else "message"))

    def _message(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        if any(isinstance(message.get(k), str) and message[k] for k in ("reasoning_content", "reasoning")):
            self.reasoned = True
        self._text(message.get("content"))
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for position, call in enumerate(calls):
                if isinstance(call, dict):
                    self._tool_call(position, call)

    def _text(self, text: Any) -> None:
        if isinstance(text, str) and text:
            self._add_chars(len(text))
            if not self.overflow:
                self._parts.append(text)

    def _tool_call(self, position: int, delta: dict[str, Any]) -> None:
        index = delta.get("index", position)
        if not isinstance(index, int) or (
            index not in self._tool_calls and len(self._tool_calls) >= MAX_TOOL_CALLS
        ):
            self.overflow = True
            return
        call = self._tool_calls.setdefault(
            index, {"id": None, "type": "function", "name": "", "arguments": ""}
        )
        if isinstance(delta.get("id"), str):
            call["id"] = delta["id"]
        function = delta.get("function")
        if isinstance(function, dict):
            for key in ("name", "arguments"):
                piece = function.get(key)
                if isinstance(piece, str):
                    self._add_chars(len(piece))
                    call[key] = call[key] + piece if not self.overflow else ""

    def _add_chars(self, n: int) -> None:
        self.chars += n
        if self.chars > self._max_chars:
            self.overflow = True
            self._parts.clear()

    # ------------------------------------------------------------------ results

    def generated(self) -> dict[str, Any] | None:
        """The reply as the next turn will carry it, or None when unknown or over the bound."""
        if self.overflow or self._endpoint is None or not (self._parts or self._tool_calls or self.reasoned):
            return None
        text = "".join(self._parts)
        if self._endpoint == "completions":
            return {"text": text}
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if self.reasoned:
            message["reasoning_content"] = ""  # present: the routing key then extends nothing past the prompt
        if self._tool_calls:
            message["tool_calls"] = [_tool_call(c) for _, c in sorted(self._tool_calls.items())]
        return message


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "function",
        "function": {"name": call["name"], "arguments": call["arguments"]},
    }
    if call["id"] is not None:
        out["id"] = call["id"]
    return out
