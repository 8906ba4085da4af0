"""LocalReplication: the processes of one ``serve --processes N`` share their prefix view, their in-flight
counts and any small snapshot (metrics) over Unix datagram sockets in a private directory.

The same protocol as the Redis replication (``sync``), over a local channel: every process binds
``<directory>/<index>.sock``; the router's change hook puts index changes in a bounded ``Outbox``; a task
drains it into datagrams (``codec`` batches, at most ``max_datagram`` bytes each) sent to every other
process; a reader applies the others' changes with ``Router.apply``. Times travel as ages (the processes
share a clock, but the codec is the Redis one). Every ``load_interval_s`` each process sends its own
in-flight counts per worker; the others' counts are summed into the load view
(``LoadTracker.set_remote_in_flight``) and forgotten after ``load_ttl_s`` without news. Snapshots
(``publish_snapshot``) are kept per sending process, latest only, for ``snapshots``. Other small messages
go to whoever ``subscribe``-d to their topic (one byte), sent with ``send``.

Failures never block routing: a datagram that cannot be sent (a process restarting, a full receive
queue) is dropped and counted (``publish_failures``); the next changes carry on.
Measured against Redis Streams on this machine: see docs/benchmarks.md ("Several processes").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from prefix_router.replication.coalesce import coalesce
from prefix_router.replication.codec import CodecError, decode_batch, encode_batch, encode_change
from prefix_router.replication.outbox import Outbox, Tap
from prefix_router.replication.stats import ReplicationStats
from prefix_router.routing import IndexChange, Router

log = logging.getLogger(__name__)
Clock = Callable[[], float]
Handler = Callable[[bytes], None]
CHANGES, LOAD, SNAPSHOT = b"C", b"L", b"S"
DATAGRAM_HEADROOM = 1024  # kind byte, batch and change headers, worker name (names are short)


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """Bounds and intervals of the local channel."""

    outbox_capacity: int = 50_000
    batch_max: int = 1024
    flush_interval_s: float = 0.01  # changes gathered this long go out together, merged (``coalesce``)
    max_datagram: int = 60_000
    socket_buffer_bytes: int = 4 * 1024 * 1024
    load_interval_s: float = 0.05
    load_ttl_s: float = 2.0
    max_snapshot_bytes: int = 1024 * 1024
    backlog_max: int = 256  # datagrams kept per process whose receive queue is full

    def __post_init__(self) -> None:
        if (
            min(
                self.outbox_capacity,
                self.batch_max,
                self.max_datagram,
                self.socket_buffer_bytes,
                self.backlog_max,
            )
            <= 0
        ):
            raise ValueError("local channel bounds must be positive")
        if self.load_interval_s <= 0 or self.load_ttl_s <= 0 or self.flush_interval_s < 0:
            raise ValueError("local channel intervals must be positive")


@dataclass(slots=True)
class _Peer:
    index: int
    path: str
    load: dict[str, int]
    load_at: float | None = None
    snapshot: bytes | None = None
    backlog: deque[bytes] = field(default_factory=deque)  # datagrams its full queue could not take yet


class LocalReplication:
    """This process's side of the local channel (``index`` of ``count`` processes in ``directory``)."""

    def __init__(
        self,
        router: Router,
        directory: Path,
        index: int,
        count: int,
        cfg: LocalConfig | None = None,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        if not 0 <= index < count:
            raise ValueError("process index out of range")
        self.router, self.index, self.clock = router, index, clock
        self.cfg = cfg or LocalConfig()
        self.outbox = Outbox(self.cfg.outbox_capacity)
        self.counters = ReplicationStats()
        self.peers = {i: _Peer(i, str(directory / f"{i}.sock"), {}) for i in range(count) if i != index}
        self._by_address: dict[object, _Peer] = {}
        self._max_blocks = max(1, (self.cfg.max_datagram - DATAGRAM_HEADROOM) // 8)  # u64 per block
        self._path = directory / f"{index}.sock"
        self._sock = _bind(self._path, self.cfg.socket_buffer_bytes)
        self._handlers: dict[bytes, Handler] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._tap = Tap(router, self.outbox)
        self._reading = False
        self.ready = False

    # ------------------------------------------------------------ lifecycle

    async def start(self, run_tasks: bool = True) -> None:
        self._tap.attach()
        self.ready = True
        if run_tasks:
            asyncio.get_running_loop().add_reader(self._sock.fileno(), self._on_readable)
            self._reading = True
            for loop in (self._flush_loop, self._load_loop):
                self._tasks.append(asyncio.create_task(loop(), name=f"local-state-{loop.__name__}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.flush()
        if self._reading:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._reading = False
        self._tap.detach()
        self.ready = False
        self._sock.close()
        with contextlib.suppress(OSError):
            self._path.unlink()

    def live_peers(self) -> int:
        """The other processes heard from within ``load_ttl_s`` (each sends its load every
        ``load_interval_s``)."""
        return sum(1 for p in self.peers.values() if self._fresh(p))

    def stats(self) -> dict[str, float]:
        out = self.counters.as_dict(len(self.outbox), self.outbox.dropped)
        out.update(
            ready=float(self.ready),
            remote_replicas=float(self.live_peers()),
        )
        return out

    # ------------------------------------------------------------ sending

    def flush_once(self) -> int:
        """Send up to ``batch_max`` queued changes to every other process; returns how many."""
        changes = self.outbox.take(self.cfg.batch_max)
        if not changes:
            return 0
        merged = coalesce(changes, self.router.index.max_prefix_blocks, self._max_blocks)
        for datagram in self._datagrams(merged):
            self._broadcast(CHANGES + datagram)
            self.counters.published_entries += 1
        self.counters.published_changes += len(changes)
        self.counters.sent_changes += len(merged)
        return len(changes)

    def flush(self) -> None:
        while self.flush_once():
            pass

    def _datagrams(self, changes: Sequence[IndexChange]) -> list[bytes]:
        """Encoded batches under ``max_datagram`` bytes each (a change too big alone is counted, not sent)."""
        now, size = self.clock(), 0
        batches: list[bytes] = []
        parts: list[bytes] = []
        for change in changes:
            try:
                part = encode_change(change, max(0.0, now - change.at))
            except CodecError:
                self.counters.encode_errors += 1
                continue
            if len(part) + 4 > self.cfg.max_datagram:
                self.counters.encode_errors += 1
                continue
            if parts and size + len(part) + 4 > self.cfg.max_datagram:
                batches.append(encode_batch(parts))
                parts, size = [], 0
            parts.append(part)
            size += len(part)
        if parts:
            batches.append(encode_batch(parts))
        return batches

    def _broadcast(self, datagram: bytes) -> None:
        for peer in self.peers.values():
            peer.backlog.append(datagram)
            self._send_backlog(peer)

    def resend(self) -> None:
        """Try again what full receive queues could not take (the load tick does it too)."""
        for peer in self.peers.values():
            self._send_backlog(peer)

    def _send_backlog(self, peer: _Peer) -> None:
        """Send what waits for ``peer``, oldest first. A full receive queue (Linux queues at most
        ``net.unix.max_dgram_qlen`` datagrams, 10 by default, whatever their size) keeps the rest for the
        next send (at the latest the next load tick), up to ``backlog_max`` datagrams; a peer that is not
        there (starting, restarting) drops them. What is dropped is counted (``publish_failures``)."""
        backlog = peer.backlog
        while backlog:
            try:
                self._sock.sendto(backlog[0], peer.path)
            except BlockingIOError:
                break
            except OSError:
                self.counters.publish_failures += len(backlog)
                backlog.clear()
                return
            backlog.popleft()
        while len(backlog) > self.cfg.backlog_max:
            backlog.popleft()
            self.counters.publish_failures += 1

    def send_load(self) -> None:
        """Tell the other processes this one's in-flight counts per worker."""
        workers = self.router.workers()
        local = {w: n for w in workers if (n := self.router.load.in_flight(w)) > 0}
        self._broadcast(LOAD + orjson.dumps(local))

    def publish_snapshot(self, payload: bytes) -> None:
        """Send a small snapshot (bounded by ``max_snapshot_bytes``) that the others keep, latest only."""
        self._send_small(SNAPSHOT, payload)

    def send(self, topic: bytes, payload: bytes) -> None:
        """Send a small message (bounded like a snapshot) to the other processes' ``topic`` handlers."""
        if topic in (CHANGES, LOAD, SNAPSHOT) or len(topic) != 1:
            raise ValueError(f"topic {topic!r} is reserved or not one byte")
        self._send_small(topic, payload)

    def subscribe(self, topic: bytes, handler: Handler) -> None:
        """Call ``handler(payload)`` for every message on ``topic`` (one handler per topic)."""
        if topic in (CHANGES, LOAD, SNAPSHOT) or len(topic) != 1:
            raise ValueError(f"topic {topic!r} is reserved or not one byte")
        self._handlers[topic] = handler

    def _send_small(self, kind: bytes, payload: bytes) -> None:
        if len(payload) + 1 > min(self.cfg.max_snapshot_bytes, self.cfg.socket_buffer_bytes // 2):
            self.counters.encode_errors += 1
            return
        self._broadcast(kind + payload)

    def snapshots(self) -> list[bytes]:
        """The latest snapshot of every other process that sent one."""
        return [p.snapshot for p in self.peers.values() if p.snapshot is not None]

    # ------------------------------------------------------------ receiving

    def read_once(self) -> int:
        """Handle every datagram waiting; returns how many index changes were applied."""
        applied = 0
        while True:
            try:
                data, sender = self._sock.recvfrom(self.cfg.max_snapshot_bytes + 1)
            except (BlockingIOError, InterruptedError):
                return applied
            applied += self._handle(data, sender)

    def _on_readable(self) -> None:
        self.read_once()

    def _handle(self, data: bytes, sender: object) -> int:
        peer = self._peer(sender)
        self.counters.received_entries += 1
        kind, payload = data[:1], data[1:]
        if peer is None:
            self.counters.decode_errors += 1
            return 0
        if kind == CHANGES:
            return self._apply(payload)
        if kind == LOAD:
            self._take_load(peer, payload)
        elif kind == SNAPSHOT:
            peer.snapshot = payload
        elif (handler := self._handlers.get(kind)) is not None:
            self._deliver(handler, payload)
        else:
            self.counters.decode_errors += 1
        return 0

    def _deliver(self, handler: Handler, payload: bytes) -> None:
        try:
            handler(payload)
        except Exception:  # a bad message must not stop the reader
            self.counters.decode_errors += 1
            log.exception("local channel: a message handler failed")

    def _peer(self, sender: object) -> _Peer | None:
        peer = self._by_address.get(sender)
        if peer is None:
            name = sender.decode() if isinstance(sender, bytes) else str(sender)
            stem = Path(name).stem
            peer = self.peers.get(int(stem)) if stem.isdigit() else None
            if peer is not None and name == peer.path:
                self._by_address[sender] = peer  # bounded: one entry per other process
        return peer

    def _apply(self, payload: bytes) -> int:
        try:
            changes = decode_batch(payload)
        except CodecError:
            self.counters.decode_errors += 1
            return 0
        now, workers, applied = self.clock(), set(self.router.workers()), 0
        for change in changes:
            if change.worker in workers:
                self.router.apply(change.at(now))
                applied += 1
            else:
                self.counters.unknown_worker_changes += 1
        self.counters.applied_changes += applied
        return applied

    def _take_load(self, peer: _Peer, payload: bytes) -> None:
        try:
            table = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.counters.decode_errors += 1
            return
        if not isinstance(table, dict):
            self.counters.decode_errors += 1
            return
        workers = set(self.router.workers())
        peer.load = {k: v for k, v in table.items() if k in workers and type(v) is int and v >= 0}
        peer.load_at = self.clock()
        self._set_remote_load()

    def _fresh(self, peer: _Peer) -> bool:
        return peer.load_at is not None and self.clock() - peer.load_at <= self.cfg.load_ttl_s

    def _set_remote_load(self) -> None:
        totals = dict.fromkeys(self.router.workers(), 0)
        for peer in self.peers.values():
            if self._fresh(peer):
                for worker, count in peer.load.items():
                    if worker in totals:
                        totals[worker] += count
        for worker, count in totals.items():
            self.router.load.set_remote_in_flight(worker, count)

    def sync_load(self) -> None:
        """Send this process's counts and refresh the remote view (forgetting stale processes)."""
        self.send_load()
        self._set_remote_load()

    # ------------------------------------------------------------ background tasks

    async def _flush_loop(self) -> None:
        while True:
            await self.outbox.wait()
            if self.cfg.flush_interval_s:
                await asyncio.sleep(self.cfg.flush_interval_s)
            self.flush()

    async def _load_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.load_interval_s)
            self.sync_load()


def _bind(path: Path, buffer_bytes: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError):
        path.unlink()
    sock.bind(str(path))
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, buffer_bytes)
    sock.setblocking(False)
    return sock
