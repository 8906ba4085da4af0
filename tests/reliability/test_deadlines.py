"""``Deadlines``: movable timeouts for shutdown, ejection and stream idleness, a registry that holds only
live waits, and the cause each early end is recorded with."""

from __future__ import annotations

import asyncio

import pytest

from prefix_router.proxy.deadlines import Cause, Deadlines


async def wait_for_ever(deadlines: Deadlines, worker: str) -> Cause | str:
    loop = asyncio.get_running_loop()
    watch = deadlines.watch(worker, loop.time() + 60)
    try:
        async with watch:
            await asyncio.Event().wait()
    except TimeoutError:
        return watch.cause
    return "finished"


async def test_eject_ends_every_wait_on_that_worker_only() -> None:
    deadlines = Deadlines()
    waits = {name: asyncio.ensure_future(wait_for_ever(deadlines, name[0])) for name in ("a1", "a2", "b1")}
    await asyncio.sleep(0.01)
    assert len(deadlines) == 3
    assert deadlines.eject("a", asyncio.get_running_loop().time()) == 2
    assert await asyncio.wait_for(asyncio.gather(waits["a1"], waits["a2"]), 1) == [Cause.EJECTED] * 2
    assert not waits["b1"].done()
    assert len(deadlines) == 1
    waits["b1"].cancel()
    await asyncio.gather(*waits.values(), return_exceptions=True)
    assert len(deadlines) == 0  # cancelled waits leave the registry too


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
            deadlines.eject("a", loop.time())
            watch.push(loop.time() + 60)  # too late: the ejection ended the wait
            await asyncio.sleep(1)
    assert watch.cause is Cause.EJECTED
