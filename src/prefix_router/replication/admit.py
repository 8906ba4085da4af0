"""What a replica takes from the stream: an entry's changes, admitted whole or refused whole.

Redis is shared by every replica, so an entry is checked before any of its changes touches the index:
its size (``max_entry_bytes``, checked before decoding), its count of changes (``batch_max``), each
change's blocks (``IndexSettings.max_prefix_blocks`` for an insert), its age (finite, not negative) and,
for a capacity, a plausible value: what engine feedback on the publishing replica could have set, at most
one feedback step (``capacity_step``) from the receiver's learned capacity and never below the
feedback's floor (``min_capacity_tokens``). A refused entry raises :class:`Refused` naming the bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from prefix_router.replication.codec import WireChange, decode_batch
from prefix_router.routing import ChangeKind, Router


class Refused(ValueError):
    """An entry outside the bounds: none of its changes is applied."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The bounds of one entry: its payload's bytes and its changes."""

    max_entry_bytes: int
    max_changes: int


def admit(payload: bytes, bounds: Bounds, router: Router) -> list[WireChange]:
    """The changes of ``payload`` if every one is within ``bounds`` and plausible for ``router``'s
    index; raises :class:`Refused` otherwise (``CodecError`` for a malformed payload)."""
    if len(payload) > bounds.max_entry_bytes:
        raise Refused(f"entry of {len(payload)} bytes over max_entry_bytes {bounds.max_entry_bytes}")
    changes = decode_batch(payload)
    if len(changes) > bounds.max_changes:
        raise Refused(f"entry of {len(changes)} changes over batch_max {bounds.max_changes}")
    _check_changes(changes, router)
    return changes


def _check_changes(changes: Sequence[WireChange], router: Router) -> None:
    capacities: dict[str, int] = {}  # a worker's capacity once this entry's earlier changes applied
    longest = router.index.max_prefix_blocks
    for change in changes:
        if not math.isfinite(change.age) or change.age < 0:
            raise Refused(f"change of age {change.age}")
        if change.kind == ChangeKind.INSERT and longest is not None and len(change.blocks) > longest:
            raise Refused(f"insert of {len(change.blocks)} blocks over max_prefix_blocks {longest}")
        if change.kind == ChangeKind.CAPACITY and change.worker in router.index:
            worker = change.worker
            current = capacities.get(worker, router.index.capacity_blocks(worker))
            low, high = capacity_range(router, worker, current)
            if not low <= change.keep <= high:
                raise Refused(f"capacity of {change.keep} blocks outside [{low}, {high}] for {worker}")
            capacities[worker] = change.keep


def capacity_range(router: Router, worker: str, current: int) -> tuple[int, int]:
    """The capacities (blocks) one feedback report may move ``worker``'s from ``current`` to."""
    tuning = router.feedback_tuning
    if tuning.capacity_step <= 0:
        return current, current
    step = math.ceil(current * tuning.capacity_step)
    floor = router.index.blocks_for(worker, tuning.min_capacity_tokens)
    return min(current, max(floor, current - step)), current + max(1, step)
