"""The simulated engine's KV cache events over real ZMQ, as vLLM's ``ZmqEventPublisher`` sends them.

- Config: vLLM's ``--kv-events-config`` JSON (``KvEventsConfig.from_json``: ``enable_kv_cache_events``,
  ``publisher`` "zmq", ``endpoint``, ``replay_endpoint``, ``topic``, ``buffer_steps``, ``hwm``; others
  refused), and the event layout: tagged maps (vLLM >= 0.26) or positional arrays (older vLLM, SGLang).
- Sockets: a PUB socket that binds when the endpoint holds ``*`` or ``::`` or is ipc/inproc and connects
  otherwise (vLLM's rule; then the router binds), and a ROUTER on ``replay_endpoint`` answering a DEALER's
  ``[b"", seq]`` with every buffered batch from ``seq`` on (``[b"", topic, seq, payload]``) and the end
  marker ``[b"", b"", -1, b""]``. The last ``buffer_steps`` batches are kept.
- Messages: ``[topic, seq, payload]``, ``seq`` from 0 in each engine process (a restart starts over),
  the payload ``[ts, events, dp_rank 0]``. The cache's listener (``PrefixCache.listener``) queues
  ``BlockStored`` (a run of chained blocks in one event, with their token ids at the engine's block size
  and the request's ``cache_salt`` in the first block's ``extra_keys``), ``BlockRemoved`` (evictions) and
  ``AllBlocksCleared`` (a reset); ``flush`` sends what is queued as one batch (the driver calls it after
  every engine step, as vLLM publishes per scheduler step; a reset is flushed at once).
- Token ids: ``BlockBook`` remembers, per block hash, its parent, its token ids and its salt when a
  request is submitted (``remember``), bounded by ``max_blocks`` (the oldest go first). A block stored
  after its entry went is not published (counted in ``unknown_blocks``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from prefix_router.events import (
    END_OF_REPLAY,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineEvent,
    EventBatch,
    encode_batch,
    seq_bytes,
)

_MEDIUM = "GPU"
_FIELDS = frozenset(
    {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "topic", "buffer_steps", "hwm"}
)
_IGNORED = frozenset({"max_queue_size"})  # vLLM's publisher thread queue: nothing to queue here


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """Where and how the simulated engine publishes its KV cache events (vLLM's field names)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10_000
    hwm: int = 100_000
    tagged: bool = True  # tagged maps (vLLM >= 0.26); False: positional arrays (older vLLM, SGLang)
    max_blocks: int = 1_000_000  # BlockBook entries

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"kv events endpoint {self.endpoint!r}: tcp://, ipc:// or inproc://")
        if self.buffer_steps < 1 or self.hwm < 1 or self.max_blocks < 1:
            raise ValueError("buffer_steps, hwm and max_blocks must be positive")

    @property
    def binds(self) -> bool:
        """vLLM's rule: a wildcard host or a local transport binds; anything else connects."""
        host = self.endpoint.split("://", 1)[1]
        return "*" in host or "::" in host or self.endpoint.startswith(("ipc://", "inproc://"))

    @classmethod
    def from_json(cls, text: str, tagged: bool = True) -> KvEventsConfig | None:
        """vLLM's ``--kv-events-config``; None when it does not enable events. Raises ValueError."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        unknown = set(raw) - _FIELDS - _IGNORED
        if unknown:
            raise ValueError(f"--kv-events-config: unknown fields {sorted(unknown)}")
        if not raw.get("enable_kv_cache_events", True) or raw.get("publisher", "zmq") == "null":
            return None
        if raw.get("publisher", "zmq") != "zmq":
            raise ValueError("--kv-events-config: the only publisher is zmq")
        return cls(
            endpoint=str(raw.get("endpoint", "tcp://*:5557")),
            replay_endpoint=raw.get("replay_endpoint"),
            topic=str(raw.get("topic", "")),
            buffer_steps=int(raw.get("buffer_steps", 10_000)),
            hwm=int(raw.get("hwm", 100_000)),
            tagged=tagged,
        )


@dataclass(frozen=True, slots=True)
class _Entry:
    parent: int | None
    tokens: tuple[int, ...]
    salt: str | None


class BlockBook:
    """Block hash -> (parent, token ids, salt of a chain's first block), at most ``capacity`` entries."""

    def __init__(self, capacity: int, block_tokens: int) -> None:
        self.capacity, self.block_tokens = capacity, block_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()

    def remember(self, blocks: Sequence[int], ids: Sequence[int], salt: str | None) -> None:
        """``blocks[i]`` holds ``ids[i*B:(i+1)*B]``, the parent of ``blocks[i+1]``."""
        size, entries, parent = self.block_tokens, self._entries, None
        for i, block in enumerate(blocks):
            if block in entries:
                entries.move_to_end(block)
            else:
                tokens = tuple(ids[i * size : (i + 1) * size])
                if len(tokens) < size:
                    return
                entries[block] = _Entry(parent, tokens, salt if parent is None else None)
            parent = block
        while len(entries) > self.capacity:
            entries.popitem(last=False)

    def get(self, block: int) -> _Entry | None:
        return self._entries.get(block)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(slots=True)
class PublisherStats:
    batches: int = 0
    dropped: int = 0  # the PUB socket refused (high-water mark): subscribers see a gap
    unknown_blocks: int = 0  # stored blocks whose token ids the book no longer had
    replay_requests: int = 0
    sockets: list[str] = field(default_factory=list)


class KvEventPublisher:
    """One engine process's publisher: ``listener`` for its cache, ``flush`` per step, ``close``."""

    def __init__(
        self, cfg: KvEventsConfig, block_tokens: int, clock: Callable[[], float] = time.time
    ) -> None:
        self.cfg, self.block_tokens, self._clock = cfg, block_tokens, clock
        self.book = BlockBook(cfg.max_blocks, block_tokens)
        self.stats = PublisherStats()
        self.seq = 0
        self._topic = cfg.topic.encode()
        self._pending: list[EngineEvent] = []
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._ctx = zmq.Context()  # the PUB socket is sent to from synchronous code (never blocks)
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, cfg.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        (self._pub.bind if cfg.binds else self._pub.connect)(cfg.endpoint)
        self._actx: zmq.asyncio.Context | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    def start_replays(self) -> None:
        """Serve replays on the running loop (when ``replay_endpoint`` is set)."""
        if self.cfg.replay_endpoint is None or self._task is not None:
            return
        self._actx = zmq.asyncio.Context()
        self._replay = self._actx.socket(zmq.ROUTER)
        self._replay.setsockopt(zmq.LINGER, 0)
        self._replay.bind(self.cfg.replay_endpoint)
        self._task = asyncio.create_task(self._answer_replays(self._replay))

    # ------------------------------------------------------------ the cache's events

    def listener(self, kind: str, block: int) -> None:
        """``PrefixCache.listener``: queues the event (sent by the next ``flush``)."""
        if kind == "stored":
            self._stored(block)
        elif kind == "removed":
            self._pending.append(BlockRemoved((block,), _MEDIUM))
        else:
            self._pending.append(AllBlocksCleared())

    def _stored(self, block: int) -> None:
        entry = self.book.get(block)
        if entry is None:
            self.stats.unknown_blocks += 1
            return
        last = self._pending[-1] if self._pending else None
        if isinstance(last, BlockStored) and entry.parent == last.block_hashes[-1]:
            extra = None if last.extra_keys is None else (*last.extra_keys, None)
            self._pending[-1] = BlockStored(
                (*last.block_hashes, block), last.parent_block_hash, last.token_ids + entry.tokens,
                self.block_tokens, medium=_MEDIUM, extra_keys=extra,
            )  # fmt: skip
            return
        extra_keys = None if entry.salt is None else ((entry.salt,),)
        self._pending.append(
            BlockStored((block,), entry.parent, entry.tokens, self.block_tokens, medium=_MEDIUM,
                        extra_keys=extra_keys)
        )  # fmt: skip

    def flush(self) -> None:
        """Send the queued events as one batch (nothing queued: nothing sent)."""
        if not self._pending:
            return
        batch = EventBatch(self._clock(), tuple(self._pending), 0)
        self._pending = []
        payload = encode_batch(batch, self.cfg.tagged)
        seq, self.seq = self.seq, self.seq + 1
        self._buffer.append((seq, payload))
        self.stats.batches += 1
        try:
            self._pub.send_multipart([self._topic, seq_bytes(seq), payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            self.stats.dropped += 1

    # ------------------------------------------------------------ replays

    async def _answer_replays(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart()
            if len(frames) < 3 or len(frames[-1]) != 8:
                continue
            ident, start = frames[0], int.from_bytes(frames[-1], "big")
            self.stats.replay_requests += 1
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await sock.send_multipart([ident, b"", self._topic, seq_bytes(seq), payload])
            await sock.send_multipart([ident, b"", b"", seq_bytes(END_OF_REPLAY), b""])

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._replay is not None and self._actx is not None:
            self._replay.close(0)
            self._actx.term()
        self._pub.close(0)
        self._ctx.term()
