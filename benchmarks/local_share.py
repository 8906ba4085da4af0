"""What sharing the prefix view costs a process of ``serve --processes N``, by flush window.

Two routers joined by the real local channel (``replication.local``, Unix datagram sockets) in one
process, driven on a simulated clock: requests (``bench-overhead``'s chat bodies: one system prompt, a
question of their own) arrive at ``--rate`` per second, are routed, dispatched and finished ``--latency-s``
later with their reply's extension, as the proxy does; every ``window`` the sender flushes (merging,
``replication.coalesce``) and the receiver applies. Printed: the sender's CPU per request for its flushes
(what sharing costs the process that served the request: merging, encoding, sending), the receiver's
(what each other process pays for this one's traffic), and changes and datagrams per request. Window 0: a
flush after every change (no merging).

    python benchmarks/local_share.py --prompt-chars 32000 --rate 700 --windows 0,0.002,0.01,0.02
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import shutil
import tempfile
import time
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from prefix_router.lab.bench.overhead import bodies
from prefix_router.replication import LocalConfig, LocalReplication
from prefix_router.routing import Outcome, Router, RoutingSettings

REPLY = {"role": "assistant", "content": "ok ok ok ok ok ok ok ok"}


async def measure(args: argparse.Namespace, window: float) -> list[str]:
    directory = Path(tempfile.mkdtemp(prefix="pr-share-"))
    now = [0.0]
    routers = [Router(RoutingSettings()) for _ in range(2)]
    for router in routers:
        router.add_worker("w0")
    sender, receiver = (
        LocalReplication(r, directory, i, 2, LocalConfig(), clock=lambda: now[0])
        for i, r in enumerate(routers)
    )
    try:
        await sender.start(run_tasks=False)
        await receiver.start(run_tasks=False)
        return drive(args, window, now, sender, receiver)
    finally:
        await sender.stop()
        await receiver.stop()
        shutil.rmtree(directory, ignore_errors=True)


def drive(
    args: argparse.Namespace,
    window: float,
    now: list[float],
    sender: LocalReplication,
    receiver: LocalReplication,
) -> list[str]:
    router, n = sender.router, args.requests
    raw = [orjson.loads(b.split(b"\r\n\r\n", 1)[1]) for b in bodies(n, args.prompt_chars, False)]
    reqs = [router.keys.build("chat", body, route_id=f"r{i}") for i, body in enumerate(raw)]
    exts = [router.keys.extend(r, "chat", body, REPLY) for r, body in zip(reqs, raw, strict=True)]
    events = [(i / args.rate, 0, i) for i in range(n)] + [
        (i / args.rate + args.latency_s, 1, i) for i in range(n)
    ]
    heapq.heapify(events)
    next_flush, cpu = 0.0, [0.0, 0.0]  # CPU seconds of the sender's flushes, of the receiver's reads

    def exchange(at: float) -> None:
        now[0] = at
        started = time.process_time()
        sender.flush()
        flushed = time.process_time()
        receiver.read_once()
        cpu[0] += flushed - started
        cpu[1] += time.process_time() - flushed

    while events:
        at, kind, i = heapq.heappop(events)
        while window and next_flush <= at:
            exchange(next_flush)
            next_flush += window
        now[0] = at
        if kind == 0:
            router.dispatched(reqs[i], router.route(reqs[i], ["w0"], at), at)
        else:
            router.finished(reqs[i], "w0", Outcome(ok=True, extension_blocks=exts[i]), at)
        if not window:
            exchange(at)
    exchange(now[0])
    stats = sender.stats()
    return [
        f"{window * 1e3:g}", f"{cpu[0] / n * 1e6:.1f}", f"{cpu[1] / n * 1e6:.1f}",
        f"{stats['sent_changes'] / n:.2f}",
        f"{stats['published_entries'] / n:.2f}",
    ]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--prompt-chars", type=int, default=32000)
    p.add_argument("--rate", type=float, default=700.0, help="requests per second into the sending process")
    p.add_argument("--latency-s", type=float, default=0.03, help="dispatch to finish")
    p.add_argument("--windows", default="0,0.002,0.01,0.02", help="flush windows in seconds")
    args = p.parse_args()
    what = f"{args.prompt_chars}-char prompts at {args.rate:g}/s, {args.latency_s * 1e3:g} ms each"
    table = Table(title=f"local channel, {what}: CPU per request by flush window")
    for column in ("window ms", "sender CPU us/req", "receiver CPU us/req", "changes/req", "datagrams/req"):
        table.add_column(column, justify="right")
    for window in (float(w) for w in args.windows.split(",")):
        table.add_row(*asyncio.run(measure(args, window)))
    Console().print(table)


if __name__ == "__main__":
    main()
