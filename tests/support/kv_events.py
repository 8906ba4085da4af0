"""A stand-in engine publishing KV cache events over real ZMQ sockets (PUB, and a ROUTER for replays),
for the subscriber's tests: the bytes are the wire format's (``prefix_router.events.encode_message``)."""

from __future__ import annotations

import asyncio
import socket

import zmq
import zmq.asyncio

from prefix_router.events import EngineEvent, EventBatch, encode_batch, encode_message, seq_bytes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class FakePublisher:
    """Publishes batches with a sequence counter; keeps them for replays (``serve_replays``)."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, bind: bool, topic: bytes = b"kv") -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        (self.sock.bind if bind else self.sock.connect)(endpoint)
        self.topic, self.seq, self.sent = topic, 0, {}  # type: ignore[var-annotated]
        self.tagged = True
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def publish(self, events: list[EngineEvent], *, skip: bool = False, ts: float = 0.0) -> int:
        """Send one batch (``skip``: count it, keep it for replays, but never send it: a gap)."""
        seq, self.seq = self.seq, self.seq + 1
        batch = EventBatch(ts, tuple(events), 0)
        self.sent[seq] = batch
        if not skip:
            await self.sock.send_multipart(encode_message(self.topic, seq, batch, self.tagged))
        return seq

    async def send_raw(self, frames: list[bytes]) -> None:
        await self.sock.send_multipart(frames)

    def serve_replays(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self._router = ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind(endpoint)
        self._task = asyncio.create_task(self._answer(self._router))

    async def _answer(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            ident, _empty, start = await sock.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq in sorted(s for s in self.sent if s >= first):
                await sock.send_multipart(
                    [ident, b"", self.topic, seq_bytes(seq), encode_batch(self.sent[seq])]
                )
            await sock.send_multipart([ident, b"", b"", seq_bytes(-1), b""])

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.sock.close(0)
        if self._router is not None:
            self._router.close(0)
