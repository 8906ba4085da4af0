from __future__ import annotations

import asyncio
from typing import Any

import pytest

from prefix_router.replication.outbox import Outbox, Tap
from prefix_router.routing.router import ChangeKind, IndexChange


def change(i: int) -> IndexChange:
    return IndexChange(ChangeKind.INSERT, "w", (i,), at=float(i))


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


def test_tap_queues_changes_after_the_previous_hook_and_detach_restores_it(kit: Any) -> None:
    router = kit.make_router()
    seen: list[IndexChange] = []
    router.on_change = seen.append
    box = Outbox(10)
    tap = Tap(router, box)
    tap.attach()
    tap.attach()  # idempotent: the previous hook is not the tap itself
    router._emit(change(1))
    assert seen == [change(1)] and box.take(10) == [change(1)]
    tap.detach()
    tap.detach()
    assert router.on_change == seen.append
    router._emit(change(2))
    assert seen == [change(1), change(2)] and len(box) == 0
