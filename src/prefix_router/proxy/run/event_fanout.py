"""``serve --processes N`` with workers whose KV cache events the router binds (``kv_events.bind``).

Only one process can bind an endpoint, so the supervisor starts one more process, the fan-out, before the
serving ones: for each such endpoint it binds an XSUB socket there (the engines' publishers connect to it
as they would to a single router) and an XPUB socket on ``ipc://DIR/kv-events-K`` in the group's private
directory, and forwards between them: every message reaches every serving process unchanged, and the
processes' subscriptions (their topics) travel back to the engines. When an engine's connection to the
endpoint drops (the XSUB's monitor), each subscribed topic gets ``events.DROPPED_CONNECTION``
before the next message, so each serving process judges a restarted engine as a directly connected
one would (``PreciseView.observe_seq``, ``reconnected``). Each serving
process's config names the ipc endpoint instead, connected (``fanned_out``), so each one decodes and
applies the events itself, judges their sequence and asks the engine's replay socket directly; nothing
event-derived crosses the local replication channel.

The fan-out reports the endpoints it could bind (``FanoutPlan``); one it could not is left to the serving
processes (one of them binds it, the others route that worker on the approximate view, as before). Only
the workers of the configuration the supervisor started with are fanned out: one added later (admin,
discovery, reload) with ``bind: true`` is bound by one process. ``hwm`` and ``max_message_bytes``
(ZMQ's ``MAXMSGSIZE``): the largest of the endpoint's workers', on both sockets.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import zmq
from zmq.utils.monitor import parse_monitor_message

from prefix_router.events import DROPPED_CONNECTION
from prefix_router.node import Config

log = logging.getLogger("prefix_router.processes")


@dataclass(frozen=True, slots=True)
class FanoutPlan:
    """Router-bound event endpoint -> the ipc endpoint the serving processes connect to instead."""

    endpoints: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.endpoints)


Wanted = dict[str, tuple[str, int, int]]  # tcp endpoint -> (ipc endpoint, hwm, max_message_bytes)


def wanted(config: Config, directory: Path) -> Wanted:
    """The endpoints to fan out: tcp endpoint -> (ipc endpoint, hwm, max message bytes), for the workers
    with ``bind`` (an endpoint shared by several workers: the largest of theirs)."""
    out: Wanted = {}
    for worker in config.workers:
        events = worker.kv_events
        if events is None or not events.bind:
            continue
        ipc, hwm, size = out.get(events.endpoint, (f"ipc://{directory}/kv-events-{len(out)}", 0, 0))
        out[events.endpoint] = (ipc, max(hwm, events.hwm), max(size, events.max_message_bytes))
    return out


def fanned_out(config: Config, plan: FanoutPlan) -> Config:
    """``config`` with the fanned-out workers connected to their ipc endpoint (their socket ends there)."""
    if not plan:
        return config
    workers = []
    for worker in config.workers:
        events = worker.kv_events
        ipc = plan.endpoints.get(events.endpoint) if events is not None and events.bind else None
        if events is not None and ipc is not None:
            worker = worker.model_copy(
                update={"kv_events": events.model_copy(update={"endpoint": ipc, "bind": False})}
            )
        workers.append(worker)
    return config.model_copy(update={"workers": workers})


def run_fanout(endpoints: Wanted, report: Connection) -> None:
    """The fan-out process: binds what it can, sends the ``FanoutPlan`` on ``report``, then forwards until
    SIGTERM (the default action: the process ends; the kernel closes its sockets)."""
    ctx = zmq.Context()
    plan: dict[str, str] = {}
    for endpoint, (ipc, hwm, max_bytes) in endpoints.items():
        pair = _bind_pair(ctx, endpoint, ipc, hwm, max_bytes)
        if pair is None:
            continue
        threading.Thread(target=_forward, args=pair, name=f"kv-events-fanout {endpoint}", daemon=True).start()
        plan[endpoint] = ipc
        log.info("kv events: %s fanned out to the serving processes", endpoint)
    report.send(FanoutPlan(plan))
    report.close()
    while True:
        signal.pause()


def _bind_pair(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, ipc: str, hwm: int, max_bytes: int
) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]] | None:
    """The endpoint's XSUB and the ipc XPUB, each capped at ``max_bytes`` a message (ZMQ drops a peer
    that sends more: the engine's publisher reconnects), or None when either cannot bind."""
    upstream, downstream = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
    for sock in (upstream, downstream):
        sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, hwm)
        sock.setsockopt(zmq.SNDHWM, hwm)
    try:
        upstream.bind(endpoint)
        downstream.bind(ipc)
    except zmq.ZMQError as exc:
        log.warning(
            "kv events: cannot bind %s for the serving processes (%s): one of them will try", endpoint, exc
        )
        upstream.close(0)
        downstream.close(0)
        return None
    return upstream, downstream


MAX_TOPICS = 256  # distinct topics tracked for the drop notice (the serving processes' subscriptions)


def _forward(upstream: zmq.Socket[bytes], downstream: zmq.Socket[bytes]) -> None:
    """Messages down, subscriptions up, and a drop notice per topic when an engine's connection drops
    (read before anything else that is ready at the same time), until the context is terminated."""
    monitor = upstream.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    poller = zmq.Poller()
    for sock in (monitor, upstream, downstream):
        poller.register(sock, zmq.POLLIN)
    topics: set[bytes] = set()
    try:
        while True:
            ready = dict(poller.poll())
            if monitor in ready and _dropped(monitor):
                for topic in topics:
                    downstream.send_multipart([topic, DROPPED_CONNECTION, b""])
            if upstream in ready:
                downstream.send_multipart(upstream.recv_multipart())
            if downstream in ready:
                frames = downstream.recv_multipart()
                _track(topics, frames[0])
                upstream.send_multipart(frames)
    except zmq.ContextTerminated:
        for sock in (monitor, upstream, downstream):
            sock.close(0)


def _dropped(monitor: zmq.Socket[bytes]) -> bool:
    return parse_monitor_message(monitor.recv_multipart())["event"] == zmq.EVENT_DISCONNECTED


def _track(topics: set[bytes], subscription: bytes) -> None:
    """An XPUB's subscription message: byte 1 + topic, or byte 0 + topic when its last subscriber left."""
    if subscription[:1] == b"\x01" and len(topics) < MAX_TOPICS:
        topics.add(subscription[1:])
    elif subscription[:1] == b"\x00":
        topics.discard(subscription[1:])
