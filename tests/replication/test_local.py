"""The local channel of ``serve --processes``: index changes, in-flight counts and snapshots reach the
other processes over real Unix datagram sockets; everything bounded, failures counted, never raised."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prefix_router.replication.local import LocalConfig, LocalReplication
from prefix_router.routing.router import ChangeKind, IndexChange


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path (Unix socket paths are limited to about 100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="pr-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def pair(
    kit: Any, directory: Path, clock: Clock, **knobs: Any
) -> tuple[LocalReplication, LocalReplication]:
    cfg = LocalConfig(**knobs)
    states = [LocalReplication(kit.make_router(i), directory, i, 2, cfg, clock=clock) for i in range(2)]
    for state in states:
        await state.start(run_tasks=False)
    return states[0], states[1]


async def test_index_changes_reach_the_other_process_with_their_age(kit: Any, short_dir: Path) -> None:
    clock = Clock()
    a, b = await pair(kit, short_dir, clock)
    blocks = kit.prefix(1, 6)
    worker = kit.dispatch(a.router, "r1", blocks, clock.now, finish=False)
    clock.now += 2.0
    assert a.flush_once() == 1 and b.read_once() == 1
    assert b.router.index.match(blocks) == {worker: 6}
    assert b.router.index.last_access(worker, blocks[0]) == pytest.approx(clock.now - 2.0)
    assert a.read_once() == 0  # nothing comes back to the sender
    await a.stop()
    await b.stop()


async def test_in_flight_counts_are_shared_then_forgotten_when_stale(kit: Any, short_dir: Path) -> None:
    clock = Clock()
    a, b = await pair(kit, short_dir, clock, load_ttl_s=1.0)
    worker = kit.dispatch(a.router, "r1", kit.prefix(2), clock.now, finish=False)
    a.sync_load()
    b.read_once()
    assert b.router.load.snapshot(worker, clock.now).in_flight == 1
    assert b.router.load.in_flight(worker) == 0  # its own count is untouched
    assert b.stats()["remote_replicas"] == 1
    clock.now += 1.5  # a's news is now stale: b forgets it
    b.sync_load()
    assert b.router.load.snapshot(worker, clock.now).in_flight == 0
    await a.stop()
    await b.stop()


async def test_snapshots_are_kept_latest_only_and_bounded(kit: Any, short_dir: Path) -> None:
    clock = Clock()
    a, b = await pair(kit, short_dir, clock, max_snapshot_bytes=1000)
    a.publish_snapshot(b"one")
    a.publish_snapshot(b"two")
    a.publish_snapshot(b"x" * 5000)  # over the bound: refused and counted
    b.read_once()
    assert b.snapshots() == [b"two"] and a.counters.encode_errors == 1
    await a.stop()
    await b.stop()


async def test_big_batches_are_split_into_datagrams_under_the_bound(kit: Any, short_dir: Path) -> None:
    clock = Clock()
    a, b = await pair(kit, short_dir, clock, max_datagram=2000)
    for i in range(20):
        a.router.on_change(IndexChange(ChangeKind.INSERT, "w0", kit.prefix(100 + i, 50), at=clock.now))  # type: ignore[misc]
    assert a.flush_once() == 20
    assert a.counters.published_entries >= 20 * 50 * 8 // 2000
    assert b.read_once() >= 20 * 50 * 8 // 2000  # merged, then cut to fit the datagrams
    assert all(b.router.index.match(kit.prefix(100 + i, 50)) == {"w0": 50} for i in range(20))
    await a.stop()
    await b.stop()


async def test_a_prompt_longer_than_a_datagram_is_shared_in_pieces(kit: Any, short_dir: Path) -> None:
    clock = Clock()
    a, b = await pair(kit, short_dir, clock, max_datagram=2000)
    blocks = kit.prefix(7, 600)  # 4,800 bytes of hashes
    worker = kit.dispatch(a.router, "r2", blocks, clock.now)
    a.flush()
    b.read_once()
    assert b.router.index.match(blocks) == a.router.index.match(blocks) == {worker: 600}
    assert a.counters.encode_errors == 0
    await a.stop()
    await b.stop()


async def test_a_missing_process_and_garbage_are_counted_not_raised(kit: Any, short_dir: Path) -> None:
    clock = Clock()
    lonely = LocalReplication(kit.make_router(0), short_dir, 0, 3, LocalConfig(), clock=clock)
    await lonely.start(run_tasks=False)
    kit.dispatch(lonely.router, "r1", kit.prefix(3), clock.now)
    lonely.flush()
    lonely.sync_load()
    assert lonely.counters.publish_failures >= 4  # two peers absent, twice
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as stranger:
        stranger.sendto(b"C\x01\x00", str(short_dir / "0.sock"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as impostor:
        impostor.bind(str(short_dir / "1.sock"))
        impostor.sendto(b"Cnot a batch", str(short_dir / "0.sock"))
        impostor.sendto(b"L[1,2]", str(short_dir / "0.sock"))
        impostor.sendto(b"?", str(short_dir / "0.sock"))
    assert lonely.read_once() == 0
    assert lonely.counters.decode_errors == 4
    await lonely.stop()
    assert not (short_dir / "0.sock").exists()


async def test_the_outbox_is_bounded(kit: Any, short_dir: Path) -> None:
    clock = Clock()
    state = LocalReplication(kit.make_router(0), short_dir, 0, 2, LocalConfig(outbox_capacity=5), clock=clock)
    await state.start(run_tasks=False)
    for i in range(12):
        kit.dispatch(state.router, f"r{i}", kit.prefix(i), clock.now)
    assert len(state.outbox) == 5 and state.outbox.dropped == 7
    await state.stop()


async def test_background_tasks_propagate_on_their_own(kit: Any, short_dir: Path) -> None:
    cfg = LocalConfig(load_interval_s=0.01)
    a, b = (LocalReplication(kit.make_router(i), short_dir, i, 2, cfg) for i in range(2))
    await a.start()
    await b.start()
    blocks = kit.prefix(7)
    worker = kit.dispatch(a.router, "r1", blocks, 0.0, finish=False)
    await kit.wait_until(lambda: b.router.index.match(blocks) == {worker: 4})
    await kit.wait_until(lambda: b.router.load.snapshot(worker, 0.0).in_flight == 1)
    await a.stop()
    await b.stop()


def test_bad_settings_are_refused(kit: Any, short_dir: Path) -> None:
    with pytest.raises(ValueError):
        LocalConfig(max_datagram=0)
    with pytest.raises(ValueError):
        LocalReplication(kit.make_router(0), short_dir, 2, 2)


async def test_a_full_receive_queue_keeps_datagrams_for_later_within_a_bound(
    kit: Any, short_dir: Path
) -> None:
    """Linux queues at most ``net.unix.max_dgram_qlen`` datagrams per socket (10 by default)."""
    clock = Clock()
    a, b = await pair(kit, short_dir, clock, backlog_max=100)
    got: list[bytes] = []
    b.subscribe(b"T", got.append)
    for i in range(60):
        a.send(b"T", str(i).encode())
    assert a.peers[1].backlog and a.counters.publish_failures == 0  # held, not lost
    for _ in range(20):
        b.read_once()
        a.resend()
    assert got == [str(i).encode() for i in range(60)]  # all of them, in order
    a.cfg = LocalConfig(backlog_max=5)
    for _ in range(60):
        a.send(b"T", b"x")
    assert len(a.peers[1].backlog) == 5 and a.counters.publish_failures > 0
    await a.stop()
    await b.stop()


async def test_whole_chains_arrive_as_such_and_keep_the_match_bisected(kit: Any, short_dir: Path) -> None:
    """A run of one span goes out as one merged insert marked whole chains: the other process keeps the
    worker chain-closed (bisected match); an older span without what was touched later does not."""
    clock = Clock()
    a, b = await pair(kit, short_dir, clock)
    worker = kit.dispatch(a.router, "r1", kit.prefix(1, 6), clock.now, finish=False)
    for i in range(2, 5):
        clock.now += 0.001
        kit.dispatch(a.router, f"r{i}", kit.prefix(1, 3) + kit.prefix(i, 2), clock.now, candidates=[worker])
    assert a.flush_once() >= 4 and b.read_once() == 1
    assert b.router.index.match(kit.prefix(1, 6)) == {worker: 6}
    assert not b.router.index.is_loose(worker)
    kit.dispatch(a.router, "r5", kit.prefix(1, 6) + kit.prefix(9, 2), clock.now, candidates=[worker])
    clock.now += 1.0  # the next insert is another span: the older one goes out without what it re-touches
    kit.dispatch(a.router, "r6", kit.prefix(1, 6), clock.now, candidates=[worker])
    a.flush()
    b.read_once()
    assert b.router.index.is_loose(worker)
    await a.stop()
    await b.stop()
