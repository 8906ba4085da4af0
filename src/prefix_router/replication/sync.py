"""RedisReplication: this replica's prefix index shared with the other replicas through Redis.

- Publish: the router's change hook puts every local index change in a bounded outbox (O(1), never
  waits); a task drains it in batches, merges each worker's runs of inserts (``coalesce``) and XADDs
  them (pipelined, stream trimmed to about ``stream_maxlen`` entries).
- Subscribe: a task XREADs the entries after the last one seen and applies the other replicas' changes
  with ``Router.apply`` (its own are skipped), ``SLICE_BLOCKS`` blocks at a time between which it yields
  to the event loop. Each entry is admitted whole or refused whole and counted (``admit``: its size,
  counts and values bounded); an entry stamped ahead of Redis's clock is refused too. Times travel as
  ages, so replicas need no common clock.
- Stream checks: when a read finds nothing new, the stream's last id is compared with the last one seen:
  behind it (the stream deleted, or Redis restarted empty), the replica reads it again from the start;
  ahead of Redis's clock by over ``FUTURE_S`` (an id no publisher can follow: the maximum id stops every
  XADD), the stream is deleted, so that replication starts over. Both are counted (``stream_resets``).
- Warm-up: ``start()`` applies the stream backlog before returning (bounded by ``warmup_timeout_s``),
  so a new replica does not route blind; ``ready`` is then true (``warmed`` says whether it succeeded).
- Load: every ``load_interval_s`` each replica publishes its in-flight counts per worker (a hash with a
  TTL, stamped with Redis's time) and adds the other replicas' sums to its load view
  (``LoadTracker.set_remote_in_flight``); a hash stamped over ``load_ttl_s`` ago, or not stamped, is
  ignored (``load_share``).
- Failures: Redis down or slow never blocks routing. Each task counts failures, backs off exponentially,
  reconnects and catches up from the last id seen; remote load is forgotten once stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

import prefix_router.replication.load_share as load_share
import prefix_router.replication.stream as stream
from prefix_router.replication.admit import Bounds, Refused, admit
from prefix_router.replication.backoff import Backoff
from prefix_router.replication.coalesce import coalesce
from prefix_router.replication.codec import CodecError, WireChange, encode_batch, encode_change
from prefix_router.replication.outbox import Outbox, Tap
from prefix_router.replication.settings import ReplicationSettings
from prefix_router.replication.stats import ReplicationStats
from prefix_router.routing import ChangeKind, IndexChange, Router

log = logging.getLogger(__name__)
Clock = Callable[[], float]
ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, asyncio.TimeoutError)
SLICE_BLOCKS = 8192  # blocks (a change counts one more) applied between two yields to the event loop
FUTURE_S = 60.0  # an entry id this far ahead of Redis's clock is refused; a stream's last one, dropped
ENTRY_HEADROOM = 1024  # an entry's bytes besides its blocks: headers and worker names
BATCH_HEADER = 3  # the codec's batch header (version, count)


class RedisReplication:
    """Shared prefix state of one router replica. ``client`` serves publishing and load sharing,
    ``reader`` the blocking reads (its socket timeout must exceed ``read_block_ms``)."""

    def __init__(
        self,
        router: Router,
        client: aioredis.Redis,
        reader: aioredis.Redis,
        replica_id: str,
        cfg: ReplicationSettings | None = None,
        *,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.router, self.client, self.reader = router, client, reader
        self.cfg = cfg or ReplicationSettings()
        self.replica_id = replica_id
        self._rng = rng if rng is not None else random.Random()
        self.origin = f"{replica_id}/{self._rng.getrandbits(32):08x}"
        self.clock, self.wall = clock, wall
        self.outbox = Outbox(self.cfg.outbox_capacity)
        self.counters = ReplicationStats()
        self.last_id = stream.START_ID
        self.warmed = False
        self.connected = False
        self._ready = False
        self._offset = 0.0  # Redis clock - local wall clock
        self._tasks: list[asyncio.Task[None]] = []
        self._tap = Tap(router, self.outbox)
        self._load_ok_at: float | None = None
        self._needs_resync = False
        self._bounds = Bounds(self.cfg.max_entry_bytes, self.cfg.batch_max)

    # ------------------------------------------------------------ lifecycle

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self, run_tasks: bool = True) -> None:
        """Hook the router, warm up from the backlog (bounded), then run the background tasks."""
        self._tap.attach()
        await self._warm_up()
        self._ready = True
        if run_tasks:
            for loop in (self._flush_loop, self._read_loop, self._load_loop):
                self._tasks.append(asyncio.create_task(loop(), name=f"redis-state-{loop.__name__}"))

    async def stop(self) -> None:
        """Cancel the tasks, publish what is left (bounded by ``op_timeout_s``), unhook, close."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.cfg.op_timeout_s)
        self._tasks.clear()
        with contextlib.suppress(*ERRORS):
            await asyncio.wait_for(self.flush(), self.cfg.op_timeout_s)
        self._tap.detach()
        self._ready = False
        for client in {id(c): c for c in (self.client, self.reader)}.values():
            with contextlib.suppress(*ERRORS):
                await client.aclose()

    def stats(self) -> dict[str, float]:
        out = self.counters.as_dict(len(self.outbox), self.outbox.dropped)
        out.update(
            connected=float(self.connected),
            warmed=float(self.warmed),
            ready=float(self._ready),
        )
        return out

    # ------------------------------------------------------------ warm-up

    async def _warm_up(self) -> None:
        started = time.perf_counter()
        try:
            await asyncio.wait_for(self._apply_backlog(), self.cfg.warmup_timeout_s)
        except ERRORS as exc:
            _reraise_cancellation()
            self.counters.read_failures += 1
            self._failed("warm-up", exc)
        else:
            self.warmed = True
            self._succeeded()
        self.counters.warmup_seconds = time.perf_counter() - started

    async def _apply_backlog(self) -> None:
        await self.resync()
        while True:
            entries = await stream.read_range(
                self.reader, self.cfg.stream_key, self.last_id, self.cfg.read_count
            )
            self.counters.warmup_changes += await self._apply(entries)
            if len(entries) < self.cfg.read_count:
                return

    # ------------------------------------------------------------ one step of each task (public for tests
    # and for drivers that run without the background tasks, like the benchmark)

    async def flush_once(self) -> int:
        """Publish up to ``batch_max x entries_per_flush`` queued changes; returns how many."""
        changes = self.outbox.take(self.cfg.batch_max * self.cfg.entries_per_flush)
        if not changes:
            return 0
        longest = (self.cfg.max_entry_bytes - ENTRY_HEADROOM) // 8
        merged = coalesce(changes, self.router.index.max_prefix_blocks, longest)
        payloads = self._encode(merged)
        if not payloads:
            return len(changes)
        try:
            await stream.publish(
                self.client, self.cfg.stream_key, self.cfg.stream_maxlen, self._origin(), payloads
            )
        except ERRORS:
            self.outbox.requeue(changes)
            raise
        self.counters.published_entries += len(payloads)
        self.counters.published_changes += len(changes)
        self.counters.sent_changes += len(merged)
        return len(changes)

    async def flush(self) -> None:
        """Publish everything queued."""
        while await self.flush_once():
            pass

    async def read_once(self, block_ms: int | None = None) -> int:
        """Apply the entries published since the last one seen; returns how many changes were applied."""
        entries = await stream.read_after(
            self.reader, self.cfg.stream_key, self.last_id, self.cfg.read_count, block_ms
        )
        return await self._apply(entries)

    async def read_step(self) -> int:
        """One step of the reading task: a resync first if the previous step failed; a read (waiting up
        to ``read_block_ms``); when it finds nothing new, a check of the stream (``check_stream``)."""
        if self._needs_resync:
            await self.resync()
        self._needs_resync = True
        entries = await stream.read_after(
            self.reader, self.cfg.stream_key, self.last_id, self.cfg.read_count, self.cfg.read_block_ms
        )
        if not entries:
            await self.check_stream()
        applied = await self._apply(entries)
        self._needs_resync = False
        return applied

    async def check_stream(self) -> None:
        """Read the stream again from the start if it is behind the last id seen (deleted, or Redis
        restarted empty); delete it if its last id is ahead of Redis's clock by over ``FUTURE_S``."""
        found = await stream.bounds(self.reader, self.cfg.stream_key)
        last = stream.parse_id(found[1]) if found is not None else (0, 0)
        now_ms = int((self.wall() + self._offset) * 1000)
        if last[0] > now_ms + FUTURE_S * 1000:
            if await stream.drop_if_after(self.client, self.cfg.stream_key, now_ms + int(FUTURE_S * 1000)):
                log.warning(
                    "shared state: stream %s had ids ahead of Redis's clock; deleted", self.cfg.stream_key
                )
                self.counters.stream_resets += 1
            return
        if last < stream.parse_id(self.last_id):
            log.warning("shared state: stream %s is behind the last id seen; reading it from the start",
                        self.cfg.stream_key)  # fmt: skip
            self.counters.stream_resets += 1
            self.last_id = stream.START_ID

    async def sync_load(self) -> None:
        """Publish this replica's in-flight counts and take in the other replicas' sums."""
        workers = self.router.workers()
        local = {w: n for w in workers if (n := self.router.load.in_flight(w)) > 0}
        server_now = self.wall() + self._offset
        hashes = await load_share.exchange(self.client, self.cfg, self.origin, local, server_now)
        for worker, count in load_share.totals(hashes, workers).items():
            self.router.load.set_remote_in_flight(worker, count)
        self.counters.remote_replicas = len(hashes)
        self._load_ok_at = self.clock()

    async def resync(self) -> None:
        """After (re)connecting: learn Redis's clock; restart from the beginning if the stream is gone or
        older than the last id seen (Redis restarted empty); count a gap if entries were trimmed unseen."""
        self._offset = await stream.server_time(self.client) - self.wall()
        found = await stream.bounds(self.reader, self.cfg.stream_key)
        if found is None or stream.parse_id(found[1]) < stream.parse_id(self.last_id):
            self.last_id = stream.START_ID
            return
        first = found[0]
        seen = stream.parse_id(self.last_id)
        if first is not None and seen != (0, 0) and stream.parse_id(first) > seen:
            self.counters.gaps += 1

    # ------------------------------------------------------------ background tasks

    async def _flush_loop(self) -> None:
        await self._forever(self.flush_once, "publish_failures", self.outbox.wait)

    async def _read_loop(self) -> None:
        await self._forever(self.read_step, "read_failures")

    async def _load_loop(self) -> None:
        async def pause() -> None:
            await asyncio.sleep(self.cfg.load_interval_s)

        await self._forever(self.sync_load, "load_failures", pause)

    async def _forever(
        self,
        step: Callable[[], Coroutine[Any, Any, Any]],
        counter: str,
        before: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        backoff = Backoff(self.cfg.backoff_initial_s, self.cfg.backoff_max_s, self._rng)
        while True:
            _reraise_cancellation()  # a cancellation swallowed inside redis-py must still end the task
            if before is not None:
                await before()
            try:
                await step()
            except ERRORS as exc:
                _reraise_cancellation()  # redis-py may turn a cancellation into a connection error
                setattr(self.counters, counter, getattr(self.counters, counter) + 1)
                self._failed(counter, exc)
                self._forget_stale_load()
                await asyncio.sleep(backoff.next())
            else:
                backoff.reset()
                self._succeeded()

    # ------------------------------------------------------------ helpers

    def _origin(self) -> bytes:
        return self.origin.encode("utf-8")

    def _encode(self, changes: Sequence[IndexChange]) -> list[bytes]:
        """Payloads of at most ``batch_max`` changes and ``max_entry_bytes`` bytes each."""
        now, parts = self.clock(), []
        for change in changes:
            try:
                parts.append(encode_change(change, max(0.0, now - change.at)))
            except CodecError:
                self.counters.encode_errors += 1
        payloads: list[bytes] = []
        batch: list[bytes] = []
        size = 0
        room = self.cfg.max_entry_bytes - BATCH_HEADER  # a part is at most ENTRY_HEADROOM over its blocks
        for part in parts:
            if batch and (len(batch) >= self.cfg.batch_max or size + len(part) > room):
                payloads.append(encode_batch(batch))
                batch, size = [], 0
            batch.append(part)
            size += len(part)
        if batch:
            payloads.append(encode_batch(batch))
        return payloads

    async def _apply(self, entries: Sequence[stream.Entry]) -> int:
        """Apply the other replicas' admitted entries, yielding to the event loop every
        ``SLICE_BLOCKS`` blocks; returns how many changes were applied."""
        now, server_now = self.clock(), self.wall() + self._offset
        workers, origin, applied, budget = set(self.router.workers()), self._origin(), 0, SLICE_BLOCKS
        for entry_id, fields in entries:
            self.last_id = entry_id
            self.counters.received_entries += 1
            if fields.get(b"o") == origin:
                self.counters.own_entries += 1
                continue
            published = stream.id_seconds(entry_id)
            changes = self._admit(fields.get(b"d", b""), published - server_now)
            published_at = now - max(0.0, server_now - published)  # the time it spent in the stream
            for change in changes:
                if change.worker not in workers:
                    self.counters.unknown_worker_changes += 1
                    continue
                for piece in pieces(change.at(published_at), SLICE_BLOCKS):
                    self.router.apply(piece)
                    budget -= len(piece.blocks) + 1
                    if budget <= 0:
                        budget = SLICE_BLOCKS
                        await asyncio.sleep(0)
                applied += 1
                self.counters.applied_changes += 1
        return applied

    def _admit(self, payload: bytes, ahead_s: float) -> list[WireChange]:
        """The entry's changes, or none if it is malformed, refused (counted) or stamped ahead of
        Redis's clock by over ``FUTURE_S``."""
        try:
            if ahead_s > FUTURE_S:
                raise Refused(f"entry stamped {ahead_s:.0f} s ahead of Redis's clock")
            return admit(payload, self._bounds, self.router)
        except Refused as exc:
            self.counters.refused_entries += 1
            if self.counters.refused_entries & (self.counters.refused_entries - 1) == 0:  # 1, 2, 4, ...
                log.warning("shared state: stream entry refused (%s); %d refused so far", exc,
                            self.counters.refused_entries)  # fmt: skip
        except CodecError:
            self.counters.decode_errors += 1
        return []

    def _succeeded(self) -> None:
        if not self.connected:
            if self.counters.failures:
                self.counters.reconnects += 1
                log.warning("shared state: connected to Redis again")
            self.connected = True

    def _failed(self, what: str, exc: BaseException) -> None:
        if self.connected:
            log.warning("shared state: Redis unavailable (%s: %s); routing on local state", what, exc)
        self.connected = False

    def _forget_stale_load(self) -> None:
        stale = self._load_ok_at is None or self.clock() - self._load_ok_at > self.cfg.load_ttl_s
        if stale:
            for worker in self.router.workers():
                self.router.load.set_remote_in_flight(worker, 0)


def pieces(change: IndexChange, size: int) -> list[IndexChange]:
    """``change`` as changes of at most ``size`` blocks that leave the same index: an insert's deepest
    blocks first (they are the oldest touches), as block lists that need not be whole chains; a trim's
    forgotten blocks (``blocks[keep:]``) piece by piece."""
    blocks = change.blocks
    if len(blocks) <= size or change.kind not in (ChangeKind.INSERT, ChangeKind.TRIM):
        return [change]
    worker, at = change.worker, change.at
    if change.kind == ChangeKind.TRIM:
        gone = blocks[max(change.keep, 0) :]
        return [
            IndexChange(ChangeKind.TRIM, worker, gone[i : i + size], 0, at) for i in range(0, len(gone), size)
        ]
    return [
        IndexChange(ChangeKind.INSERT, worker, blocks[max(0, end - size) : end], at=at, chained=False)
        for end in range(len(blocks), 0, -size)
    ]


def _reraise_cancellation() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
