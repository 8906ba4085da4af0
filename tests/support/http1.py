"""HTTP/1.1 on a raw connection, for tests that need the bytes: requests made by hand, answers parsed by
llhttp (``httptools``), several on one kept-alive connection."""

from __future__ import annotations

import asyncio

import httptools
import orjson

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
STREAMED = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})


class Parsed:
    """HTTP/1.1 responses parsed from bytes (llhttp): status, headers in order, body, one per answer."""

    def __init__(self, data: bytes) -> None:
        self.answers: list[tuple[int, list[tuple[str, str]], bytes]] = []
        self._headers: list[tuple[str, str]] = []
        self._body = b""
        self.parser = httptools.HttpResponseParser(self)
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self._headers, self._body = [], b""

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode(), value.decode()))

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.answers.append((self.parser.get_status_code(), self._headers, self._body))


def chat_request(extra: str = "", version: str = "1.1", body: bytes = CHAT) -> bytes:
    lines = [f"POST /v1/chat/completions HTTP/{version}", "Host: router", "Content-Type: application/json"]
    return (
        "\r\n".join([*lines, f"Content-Length: {len(body)}", *([extra] if extra else [])]) + "\r\n\r\n"
    ).encode() + body


async def read_answers(reader: asyncio.StreamReader, count: int) -> Parsed:
    parsed = Parsed(b"")
    while len(parsed.answers) < count:
        data = await asyncio.wait_for(reader.read(65536), 10)
        assert data, f"connection closed after {len(parsed.answers)} answers"
        parsed.parser.feed_data(data)
    return parsed
