from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefix_router.replication import codec
from prefix_router.replication.codec import KINDS, CodecError, decode_batch, encode_batch, encode_change
from prefix_router.routing.router import ChangeKind, IndexChange

COMPILED = not codec.__file__.endswith(".py")  # the compiled build (setup.py)

changes = st.builds(
    IndexChange,
    kind=st.sampled_from(KINDS),
    worker=st.text(min_size=1, max_size=80),
    blocks=st.lists(st.integers(0, 2**64 - 1), max_size=40).map(tuple),
    keep=st.integers(0, 2**32 - 1),
    at=st.just(0.0),
    chained=st.booleans(),
)


@given(st.lists(st.tuples(changes, st.floats(0, 1e6)), max_size=20))
def test_round_trip(items: list[tuple[IndexChange, float]]) -> None:
    payload = encode_batch([encode_change(change, age) for change, age in items])
    decoded = decode_batch(payload)
    assert [(d.kind, d.worker, d.blocks, d.keep, d.age, d.chained) for d in decoded] == [
        (c.kind, c.worker, c.blocks, c.keep, age, c.chained and c.kind == "insert") for c, age in items
    ]


def test_times_travel_as_ages() -> None:
    wire = decode_batch(
        encode_batch([encode_change(IndexChange(ChangeKind.INSERT, "w", (1,), at=7.0), 2.5)])
    )[0]
    assert wire.at(100.0) == IndexChange(ChangeKind.INSERT, "w", (1,), 0, 97.5)


def test_it_is_compact() -> None:
    change = IndexChange(ChangeKind.INSERT, "worker-1", tuple(range(2**60, 2**60 + 100)), at=1.0)
    assert len(encode_change(change, 0.0)) < 100 * 8 + 40


@pytest.mark.parametrize(
    "change",
    [
        # a kind of no code: built as a stand-in (the compiled build's IndexChange takes ChangeKind only)
        SimpleNamespace(kind="explode", worker="w", blocks=(1,), keep=0, at=0.0, chained=False),
        IndexChange(ChangeKind.INSERT, "w", (-1,)),
        IndexChange(ChangeKind.INSERT, "w", (2**64,)),
        IndexChange(ChangeKind.INSERT, "w" * 70_000, (1,)),
    ],
)
def test_unencodable_changes_raise(change: Any) -> None:
    # the compiled codec takes an IndexChange only: it refuses the stand-in before looking at its kind
    refusal = TypeError if isinstance(change, SimpleNamespace) and COMPILED else CodecError
    with pytest.raises(refusal):
        encode_change(change, 0.0)


def test_batches_are_bounded() -> None:
    with pytest.raises(CodecError):
        encode_batch([b""] * 70_000)


@pytest.mark.parametrize("cut", [0, 1, 2, 5, 20, 30])
def test_truncated_payloads_are_rejected(cut: int) -> None:
    payload = encode_batch([encode_change(IndexChange(ChangeKind.TRIM, "abc", (1, 2, 3), 1), 0.5)])
    with pytest.raises(CodecError):
        decode_batch(payload[:cut])


def test_other_versions_unknown_kinds_and_trailing_bytes_are_rejected() -> None:
    payload = encode_batch([encode_change(IndexChange(ChangeKind.INSERT, "w", (1,)), 0.0)])
    with pytest.raises(CodecError):
        decode_batch(b"\x09" + payload[1:])
    with pytest.raises(CodecError):
        decode_batch(payload + b"x")
    bad_kind = payload[:3] + struct.pack("<B", 9) + payload[4:]
    with pytest.raises(CodecError):
        decode_batch(bad_kind)
