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
        if not self._pending and chunk.find(b"\n") == len(chunk) - 2 and chunk.endswith(b"\n\n"):
            # one line and the blank line after it, nothing held: a whole event, as engines send them
            if chunk.startswith(b"data:"):
                self._data(chunk[5:-2].strip())
            return
        if b"\n" not in chunk:
            self._pending += chunk
            self._check_line_bound()
            return
        if self._pending:
            self._pending += chunk
            chunk = bytes(self._pending)
            self._pending.clear()
        lines = chunk.split(b"\n")
        rest = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):  # blank lines, comments and other fields carry nothing here
                self._data(line[5:].strip())
        if rest:
            self._pending += rest
            self._check_line_bound()

    def _data(self, payload: bytes) -> None:
        """One ``data:`` field's value (stripped): an event to take, ``[DONE]``, or nothing readable."""
        if not payload or payload == b"[DONE]":
            return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if type(event) is dict:
            self.take(event, delta=True)

    def _check_line_bound(self) -> None:
        if len(self._pending) > self._max_line:
            self._pending.clear()
            self.overflow = True

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
            self.usage_body = event if type(event) is dict else dict(event)
        choices = event.get("choices")
        if not choices or type(choices) is not list:
            return
        choice = choices[0]
        if type(choice) is not dict or choice.get("index", 0) != 0:
            return
        if self._endpoint == "chat":
            message = choice.get("delta" if delta else "message")
            if type(message) is dict:
                self._message(message)
        elif self._endpoint == "completions":
            self._text(choice.get("text"))

    def _message(self, message: dict[str, Any]) -> None:
        if message.get("reasoning_content") or message.get("reasoning"):
            reasoning = (message.get("reasoning_content"), message.get("reasoning"))
            if any(isinstance(r, str) and r for r in reasoning):
                self.reasoned = True
        self._text(message.get("content"))
        calls = message.get("tool_calls")
        if calls and isinstance(calls, list):
            for position, call in enumerate(calls):
                if isinstance(call, dict):
                    self._tool_call(position, call)

    def _text(self, text: Any) -> None:
        if text and type(text) is str:
            self.chars += len(text)
            if self.chars > self._max_chars:
                self.overflow = True
                self._parts.clear()
            elif not self.overflow:
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
