"""``--record FILE``: one privacy-preserving Mooncake-format line per request, appended in the background.

Each line is ``{"timestamp": ms since start, "input_length", "output_length", "hash_ids"}``. ``hash_ids``
follow Mooncake's convention: one id per ``record.block_tokens`` tokens (512 by default), each identifying
the whole prefix up to its block, so ``len(hash_ids) == ceil(input_length / block_tokens)``. Ids are the
router's chained block hashes passed through a salted hash: no text, and no link to the text without the
salt. Lines wait in a bounded buffer and are written by a background task; beyond the buffer or the file
size cap, lines are dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Callable
from pathlib import Path

import orjson
import xxhash

from prefix_router.node.settings import RecordSettings
from prefix_router.routing import RouteRequest, record_hash_ids

_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
FLUSH_INTERVAL_S = 0.5


class TraceRecorder:
    def __init__(self, cfg: RecordSettings, clock: Callable[[], float], on_drop: Callable[[], None]) -> None:
        if cfg.file is None:
            raise ValueError("record.file is not set")
        self._path = Path(cfg.file)
        self._cfg = cfg
        self._salt = cfg.salt if cfg.salt is not None else random.SystemRandom().getrandbits(63)
        self._clock = clock
        self._start = clock()
        self._on_drop = on_drop
        self._buffer: list[bytes] = []
        self._written = self._path.stat().st_size if self._path.exists() else 0
        self._pending_bytes = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def hash_ids(self, req: RouteRequest) -> list[int]:
        """One salted id per ``block_tokens`` tokens of the prompt, Mooncake style."""
        return [self._salted(block) for block in record_hash_ids(req, self._cfg.block_tokens)]

    def _salted(self, block: int) -> int:
        return xxhash.xxh3_64_intdigest((block & _MASK64).to_bytes(8, "little"), seed=self._salt) & _MASK63

    def record(self, req: RouteRequest, output_tokens: int) -> bool:
        """Queue one line; False (and counted as dropped) when the buffer or the file cap is full."""
        line = orjson.dumps(
            {
                "timestamp": int((self._clock() - self._start) * 1000),
                "input_length": req.key_tokens,
                "output_length": output_tokens,
                "hash_ids": self.hash_ids(req),
            }
        )
        size = len(line) + 1
        full = len(self._buffer) >= self._cfg.queue_size
        if full or self._written + self._pending_bytes + size > self._cfg.max_bytes:
            self._on_drop()
            return False
        self._buffer.append(line + b"\n")
        self._pending_bytes += size
        if len(self._buffer) >= 256:
            self._wake.set()
        return True

    def start(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FLUSH_INTERVAL_S)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        batch, self._buffer = self._buffer, []
        if batch:
            data = b"".join(batch)
            self._pending_bytes -= len(data)
            await asyncio.to_thread(self._append, data)
            self._written += len(data)

    def _append(self, data: bytes) -> None:
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
