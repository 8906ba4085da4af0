from __future__ import annotations

import asyncio

import pytest

from prefix_router.replication.outbox import Outbox
from prefix_router.routing.router import IndexChange


def change(i: int) -> IndexChange:
    return IndexChange("insert", "w", (i,), at=float(i))


def test_full_outbox_drops_the_oldest_and_counts() -> None:
    box = Outbox(3)
    for i in range(10):
        box.put(change(i))
    assert len(box) == 3 and box.dropped == 7
    assert [c.blocks[0] for c in box.take(10)] == [7, 8, 9]


def test_take_is_bounded_and_in_order() -> None:
    box = Outbox(10)
    for i in range(5):
        box.put(change(i))
    assert [c.blocks[0] for c in box.take(2)] == [0, 1]
    assert len(box) == 3


def test_requeue_goes_first_and_respects_the_bound() -> None:
    box = Outbox(4)
    for i in range(4):
        box.put(change(i))
    taken = box.take(3)
    box.put(change(10))
    box.put(change(11))
    box.requeue(taken)  # room for 1 of 3: the newest of them is kept
    assert [c.blocks[0] for c in box.take(10)] == [2, 3, 10, 11]
    assert box.dropped == 2


def test_requeue_with_room_keeps_everything() -> None:
    box = Outbox(10)
    box.put(change(5))
    box.requeue([change(1), change(2)])
    assert [c.blocks[0] for c in box.take(10)] == [1, 2, 5] and box.dropped == 0


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Outbox(0)


async def test_wait_returns_once_something_is_queued() -> None:
    box = Outbox(2)
    waiter = asyncio.create_task(box.wait())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    box.put(change(1))
    await asyncio.wait_for(waiter, 1.0)
