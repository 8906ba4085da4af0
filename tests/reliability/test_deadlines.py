"""``Deadlines``: movable timeouts for shutdown, ejection and stream idleness, a registry that holds only
live waits, and the cause each early end is recorded with."""

from __future__ import annotations

import asyncio

import pytest

from prefix_router.node.request.deadlines import Cause, Deadlines


async def wait_for_ever(deadlines: Deadlines, worker: str, idle_s: float | None = None) -> Cause | str:
    loop = asyncio.get_running_loop()
    watch = deadlines.watch(worker, loop.time() + 60, idle_s)
    try:
        async with watch:
            await asyncio.Event().wait()
    except TimeoutError:
        return watch.cause
    return "finished"


async def test_eject_ends_that_workers_first_byte_waits_and_silent_streams() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    waits = {
        "a first byte": asyncio.ensure_future(wait_for_ever(deadlines, "a")),
        "a stream": asyncio.ensure_future(wait_for_ever(deadlines, "a", idle_s=60)),
        "b first byte": asyncio.ensure_future(wait_for_ever(deadlines, "b")),
    }
    await asyncio.sleep(0.01)
    assert len(deadlines) == 3
    ejected = loop.time()
    assert deadlines.eject("a", ejected, grace_s=0.2) == 2
    assert await asyncio.wait_for(waits["a first byte"], 1) is Cause.EJECTED
    assert loop.time() - ejected < 0.15  # at once
    assert await asyncio.wait_for(waits["a stream"], 1) is Cause.EJECTED
    assert loop.time() - ejected >= 0.19  # a silent stream: after the grace
    assert not waits["b first byte"].done()
    assert len(deadlines) == 1
    waits["b first byte"].cancel()
    await asyncio.gather(*waits.values(), return_exceptions=True)
    assert len(deadlines) == 0  # cancelled waits leave the registry too


async def test_a_stream_that_keeps_flowing_outlives_an_ejection() -> None:
    """Its owner keeps pushing within the shortened idle limit: the stream runs on."""
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    watch = deadlines.watch("a", loop.time() + 60, idle_s=60)
    async with watch:
        deadlines.eject("a", loop.time(), grace_s=0.3)
        assert watch.idle_s == 0.3
        for _ in range(12):  # 0.6 s of chunks every 0.05 s: twice the limit, each push 6x within it
            await asyncio.sleep(0.05)
            watch.push(loop.time() + (watch.idle_s or 0))
    assert watch.cause is Cause.EJECTED  # it was ejected, yet it was not cut


async def test_stop_brings_every_wait_forward_and_caps_new_ones() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    waits = [asyncio.ensure_future(wait_for_ever(deadlines, w)) for w in ("a", "b")]
    await asyncio.sleep(0.01)
    deadlines.stop(loop.time() + 0.05)
    assert deadlines.stopping
    assert await asyncio.wait_for(asyncio.gather(*waits), 1) == [Cause.SHUTDOWN] * 2
    assert await asyncio.wait_for(wait_for_ever(deadlines, "c"), 1) is Cause.SHUTDOWN  # started after
    assert len(deadlines) == 0


async def test_a_watch_is_a_timeout_that_its_owner_can_push() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    watch = deadlines.watch("a", loop.time() + 0.01)
    with pytest.raises(TimeoutError):
        async with watch:
            await asyncio.sleep(1)
    assert watch.cause is Cause.DEADLINE
    async with deadlines.watch("a", loop.time() + 1):
        pass
    pushed = deadlines.watch("a", loop.time() + 0.05)
    async with pushed:  # pushed on before it expires, twice: it does not fire
        for _ in range(2):
            await asyncio.sleep(0.03)
            pushed.push(loop.time() + 0.05)
    with pytest.raises(TimeoutError):
        async with pushed:
            pushed.push(loop.time() + 0.01)  # brought forward
            await asyncio.sleep(1)
    assert len(deadlines) == 0


async def test_a_push_never_outlives_the_shutdown_or_an_ejection() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    deadlines.stop(loop.time() + 0.05)
    watch = deadlines.watch("a", loop.time() + 60)
    with pytest.raises(TimeoutError):
        async with watch:
            watch.push(loop.time() + 60)
            await asyncio.sleep(1)
    assert watch.cause is Cause.SHUTDOWN

    deadlines = Deadlines()
    watch = deadlines.watch("a", loop.time() + 60)
    with pytest.raises(TimeoutError):
        async with watch:
            deadlines.eject("a", loop.time(), grace_s=1)
            await asyncio.sleep(1)  # a first-byte wait: ended at once
    assert watch.cause is Cause.EJECTED
