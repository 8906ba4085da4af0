"""``Deadlines``' one shared timer: each watch behaves as ``asyncio.timeout_at`` (its deadline passed: a
``TimeoutError``; any other cancellation stays one; a wait that ended or moved on is never cut), and the
heap of deadlines stays within its bound however many waits come and go. (Shutdown, ejection and causes:
``tests/reliability/test_deadlines.py``.)"""

from __future__ import annotations

import asyncio

import pytest

from prefix_router.node.request.deadlines import HEAP_SLACK, Deadlines

SLACK_S = 0.002  # how early a loop may run a timer (its clock's resolution and rounding)


async def wait_until_cut(deadlines: Deadlines, delay_s: float) -> float:
    """Wait under a watch due in ``delay_s``; the loop time it was cut at."""
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with deadlines.watch("w", loop.time() + delay_s):
            await asyncio.sleep(60)
    return loop.time()


async def test_each_wait_is_cut_at_its_own_deadline_not_before() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    delays = [0.09, 0.01, 0.05, 0.03, 0.07, 0.05]  # out of order: the timer is re-armed for the earliest
    start = loop.time()
    cut = await asyncio.gather(*(wait_until_cut(deadlines, d) for d in delays))
    for delay, at in zip(delays, cut, strict=True):
        assert at - start >= delay - SLACK_S
    for i, j in ((i, j) for i in range(len(delays)) for j in range(len(delays)) if delays[i] < delays[j]):
        assert cut[i] <= cut[j]  # the earlier deadline is cut first (or in the same turn of the loop)
    assert len(deadlines) == 0


async def test_another_cancellation_stays_a_cancellation() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()

    async def waiting() -> None:
        async with deadlines.watch("w", loop.time() + 60):
            await asyncio.sleep(60)

    task = asyncio.ensure_future(waiting())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(deadlines) == 0


async def test_a_wait_that_ended_or_moved_on_is_not_cut() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    async with deadlines.watch("w", loop.time() + 0.02):
        pass  # ended before its deadline
    moved = deadlines.watch("w", loop.time() + 0.02)
    async with moved:
        moved.push(loop.time() + 0.08)
        await asyncio.sleep(0.05)  # past the first deadline: the timer fires, finds it moved, re-arms
        assert not moved.expired()
    await asyncio.sleep(0.04)  # the first watch's and the moved one's old deadlines: nothing pending
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
    start = loop.time()
    assert await wait_until_cut(deadlines, 0.01) - start >= 0.01 - SLACK_S  # the timer still works


async def test_a_deadline_brought_forward_cuts_at_once() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    watch = deadlines.watch("w", loop.time() + 60)
    with pytest.raises(TimeoutError):
        async with watch:
            assert watch.bring_forward(loop.time())
            await asyncio.sleep(1)
    assert watch.expired()


async def test_the_heap_stays_bounded_by_the_live_waits() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    live = [deadlines.watch("w", loop.time() + 60 + i, idle_s=60) for i in range(10)]
    for watch in live:
        await watch.__aenter__()
    for i in range(5_000):  # short waits come and go, the long ones are pushed on
        async with deadlines.watch("w", loop.time() + 30):
            live[i % 10].push(loop.time() + 61 + i)
        assert deadlines.heap_size <= 2 * len(deadlines) + HEAP_SLACK
    for watch in live:
        await watch.__aexit__(None, None, None)
    assert len(deadlines) == 0
    assert deadlines.heap_size <= HEAP_SLACK
