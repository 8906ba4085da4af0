"""Subscriptions to the workers' KV cache events (ZMQ), feeding the router's event-fed views.

One ``EventSubscriber`` per worker configured with ``kv_events`` (``pool/settings.py``), a task in the
proxy's event loop (the routing core is not thread-safe; decoding a batch is microseconds): a SUB socket
that binds or connects (``bind``), subscribed to ``topic``, at most ``hwm`` messages queued in it. Each
message is decoded (``prefix_router.events``) and applied to ``Router.precise``:

- its sequence number judged first (``PreciseView.observe_seq``): a restart clears the worker's view. A
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
- a message that does not decode is rejected (counted, logged at most once a minute), the view kept.

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
from dataclasses import dataclass
from typing import cast

import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from zmq.utils.monitor import parse_monitor_message

from prefix_router.events import (
    DROPPED_CONNECTION,
    DecodeError,
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


@dataclass(slots=True)
class SubscriberStats:
    received: int = 0
    decoded: int = 0
    rejected: int = 0
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
        self._last_reject_log = -_REJECT_LOG_S

    def start(self) -> None:
        """Open the socket and start reading; the worker joins the event-fed views now when its model is
        known (configured), else at its first message (identified by then)."""
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, self.settings.hwm)
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
        while True:
            frames = await sock.recv_multipart()
            try:
                await self.handle(frames)
            except Exception:  # a bug here must not end the subscription
                log.exception("kv events of %s: a message could not be applied", self.worker.name)

    async def handle(self, frames: list[bytes]) -> None:
        """One published message: decoded, its sequence judged, its events applied."""
        if len(frames) == 3 and frames[1] == DROPPED_CONNECTION and not frames[2]:
            self._relayed_drop = True  # the fan-out saw the engine's connection drop
            self.stats.disconnects += 1
            return
        self.stats.received += 1
        try:
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
        verdict = precise.observe_seq(name, message.seq, self._clock(), reconnected)
        if verdict == SeqVerdict.GAP and last is not None:
            if not await self._replay(last + 1, message.seq):
                precise.mark_stale(name, self._clock())
            else:
                precise.count_replay(name)
        elif verdict in (SeqVerdict.FIRST, SeqVerdict.RESTART) and message.seq > 0:
            # the first batches this process sent went before the subscription heard them (a connecting
            # PUB drops what it sends before its peer's subscription arrives; a router that starts late)
            await self._replay(0, message.seq, from_buffer_start=True)
        self._apply(message)
        self.stats.applied += 1

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

    def _apply(self, message: EventMessage) -> None:
        batch = message.batch
        self.router.precise.apply(self.worker.name, batch.events, self._clock(), batch.skipped)

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

    async def _replay(self, start: int, end: int, from_buffer_start: bool = False) -> bool:
        """Ask the engine's replay socket for batches ``start`` up to (not including) ``end``; applied in
        order. True when every one of them came (``from_buffer_start``: every one the engine still
        buffers, its oldest possibly after ``start``: a long-running engine's first batches are gone)."""
        endpoint = self.settings.replay_endpoint
        if endpoint is None:
            return False
        self.stats.replay_requests += 1
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        got = start
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
                    break
                if from_buffer_start and got < answer.seq < end:
                    got = answer.seq  # the engine's buffer begins here
                if answer.seq == got:
                    self._apply(answer)
                    self.stats.replayed_batches += 1
                    got += 1
        except (zmq.ZMQError, DecodeError) as exc:
            log.warning("kv events of %s: replay from %s failed: %s", self.worker.name, endpoint, exc)
        finally:
            dealer.close(0)
        if got < end:
            self.stats.replay_failures += 1
        return got >= end

    def _reject(self, exc: DecodeError) -> None:
        self.stats.rejected += 1
        now = self._clock()
        if now - self._last_reject_log >= _REJECT_LOG_S:
            self._last_reject_log = now
            log.warning("kv events of %s: message rejected: %s", self.worker.name, exc)


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
            "KV cache event messages per worker: received, decoded, rejected (not decodable)",
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
