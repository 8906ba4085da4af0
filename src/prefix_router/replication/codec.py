"""Compact binary encoding of index changes: one stream entry carries a batch of them.

Layout (little endian): a header ``version u8, count u16``, then per change ``kind u8, name length u16,
age f64, keep u32, block count u32``, the worker name (UTF-8) and the blocks (u64 each). Kind codes: 0
insert, 1 trim, 2 forget-older, 3 capacity, 4 insert of whole chains (``IndexChange.chained``; code 0 is
an insert that need not be). ``age`` is how
long before publication the change happened, in seconds: replicas do not share a clock, so the receiver
rebuilds the time in its own clock as ``now - age - transit`` (see ``sync``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from prefix_router.routing import ChangeKind, IndexChange

VERSION = 1
MAX_BATCH = 0xFFFF
_HEADER = struct.Struct("<BH")
_CHANGE = struct.Struct("<BHdII")
# wire codes 0, 1, 2, 3: never reorder, only append (a replica rejects a batch with a code it does not know,
# so replicas run the same version; CAPACITY, code 3, came with engine feedback that learns capacity)
# (CHAINED_INSERT, code 4, came with the index's bisected match: old replicas reject it and must be upgraded)
KINDS = (ChangeKind.INSERT, ChangeKind.TRIM, ChangeKind.FORGET_OLDER, ChangeKind.CAPACITY)
_KIND_CODES = {kind: code for code, kind in enumerate(KINDS)}
CHAINED_INSERT = len(KINDS)


class CodecError(ValueError):
    """A change that cannot be encoded, or a payload that cannot be decoded."""


@dataclass(frozen=True, slots=True)
class WireChange:
    """A decoded change: an :class:`IndexChange` whose time is an age in seconds."""

    kind: ChangeKind
    worker: str
    blocks: tuple[int, ...]
    keep: int
    age: float
    chained: bool = False

    def at(self, now: float) -> IndexChange:
        """The change in the receiver's clock, ``now`` being the receiver's time of publication."""
        return IndexChange(self.kind, self.worker, self.blocks, self.keep, now - self.age, self.chained)


def encode_change(change: IndexChange, age: float) -> bytes:
    """One change (raises CodecError for an unknown kind, an over-long name or a block outside u64)."""
    name = change.worker.encode("utf-8")
    code = _KIND_CODES.get(change.kind)
    if change.kind == ChangeKind.INSERT and change.chained:
        code = CHAINED_INSERT
    if code is None:
        raise CodecError(f"unknown change kind {change.kind!r}")
    try:
        head = _CHANGE.pack(code, len(name), age, max(change.keep, 0), len(change.blocks))
        blocks = struct.pack(f"<{len(change.blocks)}Q", *change.blocks)
    except struct.error as exc:
        raise CodecError(f"cannot encode change: {exc}") from None
    return head + name + blocks


def encode_batch(parts: Sequence[bytes]) -> bytes:
    """A payload from encoded changes (at most ``MAX_BATCH``)."""
    if len(parts) > MAX_BATCH:
        raise CodecError(f"a batch holds at most {MAX_BATCH} changes")
    return _HEADER.pack(VERSION, len(parts)) + b"".join(parts)


def decode_batch(payload: bytes) -> list[WireChange]:
    """All changes of a payload (CodecError if it is truncated, of another version or has extra bytes)."""
    try:
        version, count = _HEADER.unpack_from(payload, 0)
        if version != VERSION:
            raise CodecError(f"unsupported payload version {version}")
        offset, changes = _HEADER.size, []
        for _ in range(count):
            change, offset = _decode_one(payload, offset)
            changes.append(change)
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise CodecError(f"malformed payload: {exc}") from None
    if offset != len(payload):
        raise CodecError("malformed payload: trailing bytes")
    return changes


def _decode_one(payload: bytes, offset: int) -> tuple[WireChange, int]:
    code, name_len, age, keep, count = _CHANGE.unpack_from(payload, offset)
    offset += _CHANGE.size
    name = payload[offset : offset + name_len].decode("utf-8")
    offset += name_len
    blocks = struct.unpack_from(f"<{count}Q", payload, offset)
    offset += 8 * count
    if len(name.encode("utf-8")) != name_len:
        raise CodecError("malformed payload: truncated name")
    if code == CHAINED_INSERT:
        return WireChange(ChangeKind.INSERT, name, blocks, keep, age, chained=True), offset
    return WireChange(KINDS[code], name, blocks, keep, age), offset
