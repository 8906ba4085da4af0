"""The reply accumulator: SSE parsing across arbitrary chunk splits, bounds, tool calls, usage."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from prefix_router.node.request.sse import MAX_TOOL_CALLS, ReplyAccumulator


def event(
    delta: dict[str, Any] | None = None, usage: dict[str, Any] | None = None, text: str | None = None
) -> bytes:
    body: dict[str, Any] = {"choices": []}
    if delta is not None:
        body["choices"] = [{"index": 0, "delta": delta}]
    if text is not None:
        body["choices"] = [{"index": 0, "text": text}]
    if usage is not None:
        body["usage"] = usage
    return b"data: " + orjson.dumps(body) + b"\n\n"


STREAM = (
    event({"role": "assistant", "content": "Hel"})
    + event({"content": "lo "})
    + b": keep-alive comment\n\n"
    + event({"content": "world"})
    + event(usage={"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}})
    + b"data: [DONE]\n\n"
)


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=20))
def test_any_chunking_gives_the_same_reply(cuts: list[int]) -> None:
    points = [0, *sorted(set(cuts)), len(STREAM)]
    acc = ReplyAccumulator("chat", max_chars=1000, max_line=10_000)
    for start, end in itertools.pairwise(points):
        acc.feed(STREAM[start:end])
    assert acc.generated() == {"role": "assistant", "content": "Hello world"}
    assert (
        acc.usage_body is not None and acc.usage_body["usage"]["prompt_tokens_details"]["cached_tokens"] == 2
    )


EVENTS = [
    event({"role": "assistant", "content": "Hel"}),
    b"data:" + orjson.dumps({"choices": [{"index": 0, "delta": {"content": "lo"}}]}) + b"\n\n",  # no space
    b": keep-alive comment\n\n",
    b"data: {not json\n\n",
    b"data: [1, 2]\n\n",
    b"event: ping\n\n",
    b"data:\n\n",
    event({"content": " world"}),
    event(usage={"prompt_tokens": 3}),
    b"data: [DONE]\n\n",
]


@given(st.lists(st.sampled_from(EVENTS), max_size=12))
def test_whole_events_one_by_one_read_as_the_stream_in_one_piece(events: list[bytes]) -> None:
    one_by_one = ReplyAccumulator("chat", max_chars=1000, max_line=10_000)
    for whole in events:
        one_by_one.feed(whole)
    at_once = ReplyAccumulator("chat", max_chars=1000, max_line=10_000)
    at_once.feed(b"".join(events))
    assert one_by_one.generated() == at_once.generated()
    assert one_by_one.usage_body == at_once.usage_body and one_by_one.chars == at_once.chars


def test_crlf_lines_and_completions() -> None:
    acc = ReplyAccumulator("completions", 1000, 10_000)
    acc.feed(event(text="ab").replace(b"\n", b"\r\n") + event(text="cd"))
    assert acc.generated() == {"text": "abcd"}


def test_tool_call_deltas_are_assembled() -> None:
    acc = ReplyAccumulator("chat", 1000, 10_000)
    call = {"index": 0, "id": "c1", "function": {"name": "get_", "arguments": '{"a":'}}
    acc.feed(event({"role": "assistant", "content": None, "tool_calls": [call]}))
    acc.feed(event({"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": " 1}"}}]}))
    assert acc.generated() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"type": "function", "id": "c1", "function": {"name": "get_weather", "arguments": '{"a": 1}'}}
        ],
    }


def test_generated_text_is_bounded() -> None:
    acc = ReplyAccumulator("chat", max_chars=10, max_line=10_000)
    for _ in range(5):
        acc.feed(event({"content": "abcd"}))
    assert acc.overflow and acc.generated() is None
    assert sum(len(p) for p in acc._parts) <= 10


def test_a_line_longer_than_the_bound_is_dropped() -> None:
    acc = ReplyAccumulator("chat", max_chars=10**6, max_line=100)
    acc.feed(b"data: " + b"x" * 1000)
    assert len(acc._pending) <= 100
    acc.feed(b"\n\n" + event({"content": "ok"}))
    assert acc.overflow and acc.generated() is None


def test_tool_calls_are_bounded() -> None:
    acc = ReplyAccumulator("chat", 10**6, 10**6)
    for i in range(MAX_TOOL_CALLS + 5):
        acc.feed(event({"tool_calls": [{"index": i, "function": {"name": "f", "arguments": "{}"}}]}))
    assert len(acc._tool_calls) <= MAX_TOOL_CALLS and acc.generated() is None


def test_whole_bodies_and_garbage() -> None:
    acc = ReplyAccumulator("chat", 1000, 1000)
    acc.feed_body(orjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}]}))
    assert acc.generated() == {"role": "assistant", "content": "x"}
    for junk in (b"", b"nope", b"[1]", b'{"choices": "x"}', b'{"choices": [{"message": 3}]}'):
        other = ReplyAccumulator("chat", 1000, 1000)
        other.feed_body(junk)
        other.feed(b"data: {broken\n\ndata: 7\n\n" + junk)
        assert other.generated() is None


def test_a_reply_that_reasoned_is_marked_and_its_reasoning_not_kept() -> None:
    acc = ReplyAccumulator("chat", max_chars=10_000, max_line=10_000)
    acc.feed(event({"role": "assistant", "reasoning_content": "let me think " * 50}))
    acc.feed(event({"content": "The answer."}) + event({"reasoning_content": None, "content": " Done."}))
    assert acc.generated() == {"role": "assistant", "content": "The answer. Done.", "reasoning_content": ""}
    plain = ReplyAccumulator("chat", max_chars=10_000, max_line=10_000)
    plain.feed(event({"role": "assistant", "content": "Hi", "reasoning_content": None}))
    assert plain.generated() == {"role": "assistant", "content": "Hi"}
    whole = ReplyAccumulator("chat", max_chars=10_000, max_line=10_000)
    whole.feed_body(orjson.dumps({"choices": [{"index": 0, "message": {"content": "x", "reasoning": "r"}}]}))
    assert whole.generated() == {"role": "assistant", "content": "x", "reasoning_content": ""}
