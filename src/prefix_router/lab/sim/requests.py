"""What the simulator replays: requests with both their routing view and their engine view.

A source yields the requests that arrive on their own (in arrival order) and may produce follow-ups when
one finishes (the next turn of a conversation, for closed-loop workloads).

Mooncake rows map as follows: the router gets ``blocks`` = the row's full 512-token blocks (the hash ids,
mixed into 64-bit ints) with ``block_tokens=512``; the engine caches at the same 512-token granularity
(one trace block is 32 of vLLM's 16-token pages, reused all or nothing, which is exactly what the trace
can tell: it has no finer prefix information). Output blocks are unknown in the trace, so nothing is
cached for the generated tokens.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import xxhash

from prefix_router.lab.sim.engine import EngineRequest
from prefix_router.lab.sim.trace import TraceRow, arrival_times
from prefix_router.protocol import MOONCAKE_BLOCK_TOKENS
from prefix_router.routing import RouteRequest


@dataclass(frozen=True, slots=True)
class SimRequest:
    route: RouteRequest
    engine: EngineRequest
    arrival: float
    extension_blocks: tuple[int, ...] = ()  # router-side blocks of prompt + reply (Outcome)
    session: str | None = None
    turn: int = 0

    @property
    def request_id(self) -> str:
        return self.route.route_id


class RequestSource(Protocol):
    """Requests to replay. ``total`` is the expected number (for progress bars)."""

    total: int
    engine_block_tokens: int

    def initial(self) -> Iterator[SimRequest]: ...

    def followups(self, done: SimRequest, now: float, ok: bool = True) -> list[SimRequest]:
        """Requests caused by ``done`` ending at ``now`` (``ok`` False: it failed)."""
        ...


def mix(block_id: int) -> int:
    """A trace hash id (small ints in Mooncake, 64-bit hashes in ``--record`` files) as a 64-bit hash."""
    return xxhash.xxh3_64_intdigest((block_id & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"))


def trace_request(row: TraceRow, index: int, arrival: float) -> SimRequest:
    full = min(len(row.hash_ids), row.input_length // MOONCAKE_BLOCK_TOKENS)
    blocks = tuple(mix(h) for h in row.hash_ids[:full])
    rid = f"trace-{index}"
    hash_key = mix(row.hash_ids[0]) if row.hash_ids else 0
    route = RouteRequest(rid, blocks, MOONCAKE_BLOCK_TOKENS, row.input_length, hash_key)
    engine = EngineRequest(rid, row.input_length, max(1, row.output_length), blocks)
    return SimRequest(route, engine, arrival)


class TraceSource:
    """Open-loop replay of trace rows at their (spread, rate-scaled) timestamps."""

    engine_block_tokens = MOONCAKE_BLOCK_TOKENS

    def __init__(self, rows: Sequence[TraceRow], seed: int, rate_scale: float = 1.0) -> None:
        self.rows = rows
        self.times = arrival_times(rows, random.Random(f"arrivals:{seed}"), rate_scale)
        self.total = len(rows)

    def initial(self) -> Iterator[SimRequest]:
        for index, (row, arrival) in enumerate(zip(self.rows, self.times, strict=True)):
            yield trace_request(row, index, arrival)

    def followups(self, done: SimRequest, now: float, ok: bool = True) -> list[SimRequest]:
        return []
