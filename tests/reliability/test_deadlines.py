"""``Deadlines``: movable timeouts for shutdown and ejection, and a registry that holds only live waits."""

from __future__ import annotations

import asyncio

import pytest

from prefix_router.proxy.deadlines import Deadlines


async def wait_for_ever(deadlines: Deadlines, worker: str, first_byte: bool) -> str:
    loop = asyncio.get_running_loop()
    try:
        async with deadlines.watch(worker, loop.time() + 60, first_byte):
            await asyncio.Event().wait()
    except TimeoutError:
        return "timed out"
    return "finished"


async def test_eject_ends_only_that_workers_first_byte_waits() -> None:
    deadlines = Deadlines()
    waits = {
        ("a", True): asyncio.ensure_future(wait_for_ever(deadlines, "a", True)),
        ("a", False): asyncio.ensure_future(wait_for_ever(deadlines, "a", False)),
        ("b", True): asyncio.ensure_future(wait_for_ever(deadlines, "b", True)),
    }
    await asyncio.sleep(0.01)
    assert len(deadlines) == 3
    assert deadlines.eject("a", asyncio.get_running_loop().time()) == 1
    assert await asyncio.wait_for(waits["a", True], 1) == "timed out"
    assert not waits["a", False].done() and not waits["b", True].done()
    assert len(deadlines) == 2
    for task in waits.values():
        task.cancel()
    await asyncio.gather(*waits.values(), return_exceptions=True)
    assert len(deadlines) == 0  # cancelled waits leave the registry too


async def test_stop_brings_every_wait_forward_and_caps_new_ones() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    waits = [asyncio.ensure_future(wait_for_ever(deadlines, w, f)) for w, f in (("a", True), ("b", False))]
    await asyncio.sleep(0.01)
    deadlines.stop(loop.time() + 0.05)
    assert deadlines.stopping
    assert await asyncio.wait_for(asyncio.gather(*waits), 1) == ["timed out", "timed out"]
    assert await asyncio.wait_for(wait_for_ever(deadlines, "c", True), 1) == "timed out"  # started after
    assert len(deadlines) == 0


async def test_a_watch_is_a_timeout() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with deadlines.watch("a", loop.time() + 0.01, first_byte=True):
            await asyncio.sleep(1)
    async with deadlines.watch("a", loop.time() + 1, first_byte=True):
        pass
    assert len(deadlines) == 0
