"""``EventHold``: relayed SSE bytes go out up to the end of their last whole event, in order, nothing lost
(held bytes are let go past the bound, or at the end of the body)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from prefix_router.proxy.edge.exchange import EventHold

EVENT = st.sampled_from([b'data: {"a": 1}\n\n', b"data: x\r\n\r\n", b": comment\n\n", b"data: [DONE]\n\n"])


@given(st.lists(EVENT, max_size=8), st.binary(max_size=30), st.lists(st.integers(0, 400), max_size=6))
def test_whole_events_go_out_in_order_and_the_rest_is_held(
    events: list[bytes], tail: bytes, cuts: list[int]
) -> None:
    stream = b"".join(events) + tail.replace(b"\n", b"").replace(b"\r", b"")  # tail: an unfinished event
    hold = EventHold(limit=10_000)
    bounds = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    sent = bytearray()
    for start, end in itertools.pairwise(bounds):
        out = hold.whole_events(stream[start:end])
        assert not out or out.endswith((b"\n\n", b"\r\n\r\n"))
        sent += out
    assert bytes(sent) == b"".join(events)  # the unfinished event is held, all whole ones went out
    assert bytes(sent) + hold.take() == stream


def test_an_event_longer_than_the_bound_is_let_go() -> None:
    hold = EventHold(limit=8)
    assert hold.whole_events(b"data: 12") == b""
    assert hold.whole_events(b"345") == b"data: 12345"
    assert hold.pending == b""


def held_by_the_rule(pending: bytes, chunk: bytes, limit: int) -> tuple[bytes, bytes]:
    """What ``whole_events`` lets go and holds, by its rule alone: up to the end of the last separator."""
    data = pending + chunk
    end = max(
        (i + len(sep) for sep in (b"\n\n", b"\n\r\n", b"\r\r") if (i := data.rfind(sep)) >= 0), default=0
    )
    if end == len(data) or len(data) - end > limit:
        return data, b""
    return data[:end], data[end:]


PIECE = st.sampled_from([b"data: x", b"\n", b"\r", b"\n\n", b"\r\n\r\n", b"\r\r", b"data: [DONE]\n\n", b"yz"])


@given(st.lists(st.lists(PIECE, max_size=6).map(b"".join), max_size=10), st.integers(0, 40))
def test_whole_events_follows_its_rule_on_every_chunk(chunks: list[bytes], limit: int) -> None:
    hold = EventHold(limit=limit)
    for chunk in chunks:
        expected = held_by_the_rule(hold.pending, chunk, limit)
        assert (hold.whole_events(chunk), hold.pending) == expected
