"""A lean HTTP/1.1 keep-alive load generator for ``bench-overhead`` (lighter than any client library,
so that on a small machine the measurement is of the servers, not of the client).

It understands exactly what the bench servers send: ``Content-Length`` bodies and chunked bodies.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import cast


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiter: asyncio.Future[int] | None = None
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        status = _complete(self._buf)
        if status and self._waiter is not None and not self._waiter.done():
            self._buf.clear()
            self._waiter.set_result(status)

    async def request(self, raw: bytes) -> int:
        """Send one request; return its status once the whole response arrived."""
        if self._lost or self.transport is None:
            raise ConnectionError("connection lost")
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self._waiter


def _complete(buf: bytearray) -> int:
    """The status of the complete response in ``buf``, or 0 while incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return 0
    head = bytes(buf[:end]).lower()
    status = int(head[9:12])
    marker = head.find(b"content-length:")
    if marker >= 0:
        line_end = head.find(b"\r\n", marker)
        length = int(head[marker + 15 : line_end if line_end > 0 else len(head)])
        return status if len(buf) >= end + 4 + length else 0
    return status if buf.endswith(b"\r\n0\r\n\r\n") else 0


def request_bytes(path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Result:
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed_s: float = 0.0

    @property
    def rate(self) -> float:
        return len(self.latencies_s) / self.elapsed_s if self.elapsed_s else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(port: int, requests: list[bytes], concurrency: int, on_done: object = None) -> Result:
    """Send ``requests`` over ``concurrency`` connections; time each one."""
    loop = asyncio.get_running_loop()
    conns = [(await loop.create_connection(_Connection, "127.0.0.1", port))[1] for _ in range(concurrency)]
    result = Result()
    queue = iter(requests)

    async def drive(conn: _Connection) -> None:
        for raw in queue:
            start = time.perf_counter()
            try:
                status = await conn.request(raw)
            except ConnectionError:
                result.errors += 1
                return
            result.latencies_s.append(time.perf_counter() - start)
            if status != 200:
                result.errors += 1
            if callable(on_done):
                on_done()

    began = time.perf_counter()
    await asyncio.gather(*(drive(c) for c in conns))
    result.elapsed_s = time.perf_counter() - began
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()
    return result
