"""Subscriptions to the workers' KV cache events (ZMQ), feeding the router's event-fed views.

One ``EventSubscriber`` per worker configured with ``kv_events`` (``pool/settings.py``), a task in the
proxy's event loop (the routing core is not thread-safe; decoding a batch is microseconds): a SUB socket
that binds or connects (``bind``), subscribed to ``topic``, at most ``hwm`` messages queued in it. Each
message is decoded (``prefix_router.events``) and applied to ``Router.precise``:

- its sequence number judged first (``PreciseView.observe_seq``): a restart clears the worker's view, if
  the engine itself confirms it: a probe or request to the engine failed since the last message applied
  (``HealthState.failed_results``), or the worker is ejected now. Anyone who can reach an endpoint the
  router binds can publish on it: an unconfirmed restart is refused (nothing applied, counted
  ``refused_restarts``, the view stale for ``stale_hold_s``), and so is a message whose gap the engine's
  own replay socket answers up to its end without reaching it (the engine never sent that sequence). A
  restart is a sequence not above the last, or any but the next on a connection that replaced a dropped
  one. The socket's monitor reports each dropped publisher connection (``disconnects``; behind a
  fan-out, its ``DROPPED_CONNECTION`` message does), read before the next message is judged: a new
  engine process heard again only past the old one's last sequence is not taken for a gap in the old
  one's stream (a live engine whose connection dropped and lost messages is judged the same: its view is
  rebuilt from its replay buffer, which predicts less, never more);
- a gap asks the engine's replay socket (``replay_endpoint``, a DEALER) for the skipped batches, applied
  in order before the message, and marks the view stale when there is no replay socket, the answer does
  not cover the gap or ``replay_timeout_s`` passes;
- an engine process's first message heard (at start, or after a restart) with a sequence above 0 asks for
  the batches before it too, as far back as the engine buffers them (a connecting PUB drops what it sends
  before the router's subscription reaches it; a router that starts after its engines), kept as they are
  without a replay socket (the view then lacks those blocks: it predicts less, never more);
- a message that does not decode or is larger than ``max_message_bytes`` is rejected (counted, logged at
  most once a minute), the view kept;
- the loop's share: the subscriber gives the event loop back after every ``YIELD_EVERY`` messages (a queued
  message is handed over without a suspension), a payload over ``THREAD_DECODE_BYTES`` is decoded in a
  worker thread, and a stored chain is applied ``APPLY_BLOCKS`` blocks at a time with the loop given back
  between; messages past ``max_messages_per_s`` (a one-second burst) are shed undecoded (counted ``shed``)
  and the view marked stale: the sequence gap they leave asks for a replay at the next message kept.

Each router process subscribes itself (events are per engine; nothing is re-replicated). ``bind`` with
several processes on one host is refused by the OS for all but one (the others log it and route that
worker on the approximate view). ``EventSubscriptions.sync`` starts and stops subscribers as workers join
and leave the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import cast

import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from zmq.utils.monitor import parse_monitor_message

from prefix_router.events import (
    DROPPED_CONNECTION,
    BlockRemoved,
    BlockStored,
    DecodeError,
    EngineEvent,
    EventMessage,
    decode_message,
    decode_replay,
    seq_bytes,
)
from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.settings import KvEventsSettings
from prefix_router.pool.worker import Worker
from prefix_router.routing import Router, SeqVerdict

log = logging.getLogger(__name__)
_REJECT_LOG_S = 60.0
YIELD_EVERY = 64  # messages handled between two suspensions of the receive loop
THREAD_DECODE_BYTES = 64 << 10  # a larger payload is decoded off the event loop
APPLY_BLOCKS = 512  # blocks of a stored chain applied between two suspensions


class _Replay(Enum):
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"  # no replay socket, a timeout, an error, or the engine's buffer starts later
    BEHIND = "behind"  # the engine ended its answer before the sequence asked about


@dataclass(slots=True)
class SubscriberStats:
    received: int = 0
    decoded: int = 0
    rejected: int = 0  # not decodable, or larger than max_message_bytes
    shed: int = 0  # past max_messages_per_s: dropped undecoded
    refused: int = 0  # decoded, not applied: a restart the engine did not confirm, a sequence it never sent
    failed: int = 0  # decoded, but applying it raised (a bug: logged at most once a minute)
    replay_requests: int = 0
    replayed_batches: int = 0
    replay_failures: int = 0
    unresolved_model: int = 0  # messages before the worker's model was known (not applied)
    applied: int = 0  # messages applied to the view, after the replays they asked for
    lag_s: float = 0.0  # wall clock at receipt minus the batch's timestamp, last message
    disconnects: int = 0  # publisher connections dropped (the socket's monitor), counted at the next message
    socket_error: str | None = None


class EventSubscriber:
    def __init__(
        self,
        worker: Worker,
        router: Router,
        settings: KvEventsSettings,
        context: zmq.asyncio.Context,
        clock: Callable[[], float],
    ) -> None:
        self.worker, self.router, self.settings = worker, router, settings
        self._context, self._clock = context, clock
        self.stats = SubscriberStats()
        self._task: asyncio.Task[None] | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._relayed_drop = False
        self._logged: dict[str, float] = {}  # when a line of each kind was last logged (``_log_due``)
        self._tokens, self._refilled = settings.max_messages_per_s, clock()
        self._witness = worker.health.failed_results  # at the last message applied

    def start(self) -> None:
        """Open the socket and start reading; the worker joins the event-fed views now when its model is
        known (configured), else at its first message (identified by then)."""
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, self.settings.hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_bytes)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.settings.topic.encode())
        try:
            (sock.bind if self.settings.bind else sock.connect)(self.settings.endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            self.stats.socket_error = str(exc)
            log.warning(
                "kv events of %s: cannot %s %s (%s): routed on the approximate view",
                self.worker.name, "bind" if self.settings.bind else "connect", self.settings.endpoint, exc,
            )  # fmt: skip
            return
        self._sock = sock
        self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._resolve_model()
        self._task = asyncio.create_task(self._run(sock))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._sock is not None:
            if self._monitor is not None:
                self._sock.disable_monitor()
                self._monitor.close(0)
                self._monitor = None
            self._sock.close(0)
            self._sock = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self, sock: zmq.asyncio.Socket) -> None:
        handled = 0
        while True:
            frames = await sock.recv_multipart()
            try:
                await self.handle(frames)
            except Exception:  # a bug here must not end the subscription
                self.stats.failed += 1
                if self._log_due("failed"):
                    log.exception("kv events of %s: a message could not be applied", self.worker.name)
            handled += 1
            if handled >= YIELD_EVERY:  # a queued message comes without a suspension: give the loop back
                handled = 0
                await asyncio.sleep(0)

    async def handle(self, frames: list[bytes]) -> None:
        """One published message: shed past the rate, decoded, its sequence judged, its events applied."""
        if len(frames) == 3 and frames[1] == DROPPED_CONNECTION and not frames[2]:
            self._relayed_drop = True  # the fan-out saw the engine's connection drop
            self.stats.disconnects += 1
            return
        self.stats.received += 1
        if not self._admit():
            return
        size = sum(len(f) for f in frames)
        if size > self.settings.max_message_bytes:
            self._reject(DecodeError(f"a message of {size} bytes (max_message_bytes)"))
            return
        try:
            if size > THREAD_DECODE_BYTES:
                message = await asyncio.to_thread(decode_message, frames)
            else:
                message = decode_message(frames)
        except DecodeError as exc:
            self._reject(exc)
            return
        self.stats.decoded += 1
        if not self._resolve_model():
            self.stats.unresolved_model += 1
            return
        self.stats.lag_s = max(0.0, time.time() - message.batch.ts)
        precise, name = self.router.precise, self.worker.name
        last = _last_seq(self.router, name)
        reconnected = await self._dropped()
        verdict = precise.observe_seq(
            name, message.seq, self._clock(), reconnected, confirmed=self._restart_confirmed()
        )
        if verdict == SeqVerdict.REFUSED:
            self._refused("a restart the engine did not confirm", message.seq)
            return
        if verdict == SeqVerdict.GAP and last is not None:
            outcome, got = await self._replay(last + 1, message.seq)
            if outcome == _Replay.BEHIND:
                precise.restore_seq(name, got - 1)
                self._refused("a sequence past the engine's own", message.seq)
                return
            if outcome == _Replay.COMPLETE:
                precise.count_replay(name)
            else:
                precise.mark_stale(name, self._clock())
        elif verdict in (SeqVerdict.FIRST, SeqVerdict.RESTART) and message.seq > 0:
            # the first batches this process sent went before the subscription heard them (a connecting
            # PUB drops what it sends before its peer's subscription arrives; a router that starts late)
            await self._replay(0, message.seq, from_buffer_start=True)
        await self._apply(message)
        self.stats.applied += 1
        self._witness = self.worker.health.failed_results

    def _restart_confirmed(self) -> bool:
        """Whether the engine itself shows a restart may have happened: a probe or request failed since the
        last message applied, or it is ejected now (down; the router forgot its cache then too)."""
        health = self.worker.health
        return health.failed_results != self._witness or health.verdict == "ejected"

    def _refused(self, why: str, seq: int) -> None:
        self.stats.refused += 1
        if self._log_due("refused"):
            log.warning("kv events of %s: message seq %d refused: %s", self.worker.name, seq, why)

    def _admit(self) -> bool:
        """A token of the ``max_messages_per_s`` bucket (a second's worth at most); none: the message is
        shed and the worker's view marked stale (what it carried is missing)."""
        now, rate = self._clock(), self.settings.max_messages_per_s
        self._tokens = min(rate, self._tokens + max(0.0, now - self._refilled) * rate)
        self._refilled = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.stats.shed += 1
        self.router.precise.mark_stale(self.worker.name, now)
        return False

    async def _dropped(self) -> bool:
        """Whether a publisher connection dropped since the last message: a fan-out's relayed drop, or the
        monitor's queued events, all read (ZMQ queues one as it sees a connection close: for a restarted
        engine, before the new process's first message)."""
        monitor, dropped, self._relayed_drop = self._monitor, self._relayed_drop, False
        while monitor is not None and cast(int, monitor.get(zmq.EVENTS)) & zmq.POLLIN:
            frames = await monitor.recv_multipart(zmq.NOBLOCK)
            if parse_monitor_message(frames)["event"] == zmq.EVENT_DISCONNECTED:
                self.stats.disconnects += 1
                dropped = True
        return dropped

    async def _apply(self, message: EventMessage) -> None:
        """The batch's events in order, at most ``APPLY_BLOCKS`` blocks between two suspensions."""
        batch, name = message.batch, self.worker.name
        pieces = list(_pieces(batch.events))
        for i, piece in enumerate(pieces):
            if i:
                await asyncio.sleep(0)
            skipped = batch.skipped if not i else 0
            self.router.precise.apply(
                name, piece, self._clock(), skipped, self.router.engine_block_tokens(name)
            )

    def _resolve_model(self) -> bool:
        """The worker joins the event-fed views once its model is known (configured or listed)."""
        name = self.worker.name
        if name in self.router.precise:
            return True
        model = self.settings.model or next(iter(self.worker.model_ids()), None)
        if model is None:
            return False
        self.router.add_event_worker(name, model)
        return name in self.router.precise

    async def _replay(self, start: int, end: int, from_buffer_start: bool = False) -> tuple[_Replay, int]:
        """Ask the engine's replay socket for batches ``start`` up to (not including) ``end``; applied in
        order. ``COMPLETE`` when every one of them came (``from_buffer_start``: every one the engine still
        buffers, its oldest possibly after ``start``: a long-running engine's first batches are gone);
        ``BEHIND`` when the engine ended its answer with nothing at or after ``end``: it never sent
        ``end``, the message that asked. With the next sequence not applied."""
        endpoint = self.settings.replay_endpoint
        if endpoint is None:
            return _Replay.INCOMPLETE, start
        self.stats.replay_requests += 1
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        got, highest, ended = start, -1, False
        try:
            dealer.connect(endpoint)
            await dealer.send_multipart([b"", seq_bytes(start)])
            deadline = self._clock() + self.settings.replay_timeout_s
            while got < end:
                left = deadline - self._clock()
                if left <= 0 or not await dealer.poll(int(left * 1000)):
                    break
                answer = decode_replay(await dealer.recv_multipart())
                if answer is None:
                    ended = True
                    break
                highest = max(highest, answer.seq)
                if from_buffer_start and got < answer.seq < end:
                    got = answer.seq  # the engine's buffer begins here
                if answer.seq == got:
                    await self._apply(answer)
                    await asyncio.sleep(0)  # a buffered answer comes without a suspension
                    self.stats.replayed_batches += 1
                    got += 1
        except (zmq.ZMQError, DecodeError) as exc:
            log.warning("kv events of %s: replay from %s failed: %s", self.worker.name, endpoint, exc)
        finally:
            dealer.close(0)
        if got >= end:
            return _Replay.COMPLETE, got
        self.stats.replay_failures += 1
        return (_Replay.BEHIND if ended and highest < end else _Replay.INCOMPLETE), got

    def _reject(self, exc: DecodeError) -> None:
        self.stats.rejected += 1
        if self._log_due("rejected"):
            log.warning("kv events of %s: message rejected: %s", self.worker.name, exc)

    def _log_due(self, kind: str) -> bool:
        """Whether a line of ``kind`` (``failed``, ``refused``, ``rejected``: three at most) may be logged
        now: one a kind per ``_REJECT_LOG_S``, so that a flood of bad messages is counted, not logged."""
        now = self._clock()
        last = self._logged.get(kind)
        if last is not None and now - last < _REJECT_LOG_S:
            return False
        self._logged[kind] = now
        return True


def _pieces(events: tuple[EngineEvent, ...]) -> Iterator[list[EngineEvent]]:
    """``events`` in runs of at most ``APPLY_BLOCKS`` blocks; a longer stored chain cut into chains that
    each continue the previous one (the same keys: a block's key depends only on its parent's and its
    tokens)."""
    run: list[EngineEvent] = []
    blocks = 0
    for event in events:
        parts = _cut(event) if isinstance(event, BlockStored) else [event]
        for part in parts:
            size = len(part.block_hashes) if isinstance(part, BlockStored | BlockRemoved) else 1
            if run and blocks + size > APPLY_BLOCKS:
                yield run
                run, blocks = [], 0
            run.append(part)
            blocks += size
    if run:
        yield run


def _cut(event: BlockStored) -> list[BlockStored]:
    hashes, size, extra = event.block_hashes, event.block_size, event.extra_keys
    if len(hashes) <= APPLY_BLOCKS:
        return [event]
    out = []
    for start in range(0, len(hashes), APPLY_BLOCKS):
        end = start + APPLY_BLOCKS
        parent = event.parent_block_hash if start == 0 else hashes[start - 1]
        tokens = event.token_ids[start * size : end * size]
        out.append(
            replace(event, block_hashes=hashes[start:end], parent_block_hash=parent, token_ids=tokens,
                    extra_keys=None if extra is None else extra[start:end])
        )  # fmt: skip
    return out


def _last_seq(router: Router, name: str) -> int | None:
    summary = router.precise.summary(name, 0.0) if name in router.precise else None
    last = None if summary is None else summary["last_seq"]
    return last if isinstance(last, int) else None


class EventSubscriptions:
    """The subscribers of the pool's workers that have ``kv_events``, kept in step by ``sync``; none unless
    the routing key reads the engines' events (``routing.keys.mode: events``)."""

    def __init__(self, pool: WorkerPool, router: Router, clock: Callable[[], float]) -> None:
        self.pool, self.router, self.clock = pool, router, clock
        self._context: zmq.asyncio.Context | None = None
        self.subscribers: dict[str, EventSubscriber] = {}

    async def sync(self) -> None:
        events = self.router.cfg.keys.mode == "events"
        wanted = {w.name: w for w in self.pool if events and w.kv_events is not None}
        gone = [
            n
            for n, s in self.subscribers.items()
            if n not in wanted or s.worker is not wanted[n] or s.settings != wanted[n].kv_events
        ]
        for name in gone:
            await self.subscribers.pop(name).stop()
        for name, worker in wanted.items():
            if name not in self.subscribers and worker.kv_events is not None:
                if self._context is None:
                    self._context = zmq.asyncio.Context()
                sub = EventSubscriber(worker, self.router, worker.kv_events, self._context, self.clock)
                sub.start()
                self.subscribers[name] = sub

    async def close(self) -> None:
        for sub in self.subscribers.values():
            await sub.stop()
        self.subscribers.clear()
        if self._context is not None:
            self._context.term()
            self._context = None


_FAULTS = (
    "gaps",
    "replays",
    "restarts",
    "refused_restarts",
    "clears",
    "orphan_blocks",
    "unknown_removals",
    "skipped_events",
    "block_size_mismatches",
    "evicted_mappings",
    "speculative_confirmed",
    "speculative_expired",
)


class KvEventsCollector(Collector):
    """``/metrics`` of the subscriptions and the event-fed views, per worker (bounded by the workers)."""

    def __init__(self, subscriptions: EventSubscriptions) -> None:
        self.subs = subscriptions

    def collect(self) -> Iterator[Metric]:
        router, now = self.subs.router, self.subs.clock()
        messages = CounterMetricFamily(
            "prefix_router_kv_events_messages",
            "KV cache event messages per worker: received, decoded, rejected (not decodable or too "
            "large), shed (past max_messages_per_s), refused (a restart the engine did not confirm, a "
            "sequence it never sent), failed (could not be applied)",
            labels=["worker", "outcome"],
        )
        faults = CounterMetricFamily(
            "prefix_router_kv_events_faults",
            "Event stream faults and repairs per worker (gaps, replays, restarts, clears, orphans, ...)",
            labels=["worker", "kind"],
        )
        lag = GaugeMetricFamily(
            "prefix_router_kv_events_lag_seconds",
            "Receipt time minus the last batch's timestamp",
            labels=["worker"],
        )
        fresh = GaugeMetricFamily(
            "prefix_router_kv_events_fresh",
            "1 while the worker is routed on its events, 0 on the approximate view (see /admin/routing)",
            labels=["worker"],
        )
        blocks = GaugeMetricFamily(
            "prefix_router_worker_blocks",
            "Blocks the router holds per worker, by source",
            labels=["worker", "source"],
        )
        stored = CounterMetricFamily(
            "prefix_router_kv_events_blocks",
            "Blocks the events said a worker's engine stored or removed",
            labels=["worker", "kind"],
        )
        agreement = CounterMetricFamily(
            "prefix_router_precise_predictions",
            "Predictions on the event-fed view against the engine's cached tokens: all reports, within one "
            "engine block, above the report, above the prompt",
            labels=["worker", "outcome"],
        )
        for name, sub in self.subs.subscribers.items():
            s = sub.stats
            for outcome, value in (
                ("received", s.received),
                ("decoded", s.decoded),
                ("rejected", s.rejected),
                ("shed", s.shed),
                ("refused", s.refused),
                ("failed", s.failed),
            ):
                messages.add_metric([name, outcome], value)
            faults.add_metric([name, "replay_failures"], s.replay_failures)
            faults.add_metric([name, "disconnects"], s.disconnects)
            lag.add_metric([name], s.lag_s)
            if name not in router.precise:
                fresh.add_metric([name], 0)
                continue
            stats = router.precise.stats(name)
            for kind in _FAULTS:
                faults.add_metric([name, kind], getattr(stats, kind))
            fresh.add_metric([name], float(router.precise.fresh(name, now)))
            stored.add_metric([name, "stored"], stats.stored_blocks)
            stored.add_metric([name, "removed"], stats.removed_blocks)
            blocks.add_metric([name, "events"], router.precise.held_blocks(name))
            blocks.add_metric([name, "speculative"], router.precise.speculative_blocks(name))
            for outcome, value in (
                ("reports", stats.reports),
                ("within_block", stats.within_block),
                ("above_report", stats.above_report),
                ("above_prompt", stats.above_prompt),
            ):
                agreement.add_metric([name, outcome], value)
        for name in router.workers():
            blocks.add_metric([name, "approximate"], router.index.blocks_of(name))
        yield from (messages, faults, lag, fresh, blocks, stored, agreement)
