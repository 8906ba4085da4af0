"""Reading Mooncake-format traces (and the router's ``--record`` files, which use the same format).

One JSON object per line: ``timestamp`` (ms from the start), ``input_length``, ``output_length`` (tokens)
and ``hash_ids``: ``hash_ids[i]`` names the whole prefix of the first (i+1) x 512 tokens. The published
Mooncake trace buckets its timestamps (about 3 s); the requests of one bucket are spread uniformly at
random (seeded) over the bucket, so a replay does not send them in one burst.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby, pairwise
from pathlib import Path
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class TraceRow:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


class TraceError(ValueError):
    """A line of the trace file is not a valid Mooncake record."""


def read_trace(path: str | Path, limit: int | None = None) -> list[TraceRow]:
    """Rows of a trace file, in file order (at most ``limit``), sorted by timestamp (stable)."""
    rows: list[TraceRow] = []
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            if limit is not None and len(rows) >= limit:
                break
            if line.strip():
                rows.append(parse_row(line, number))
    rows.sort(key=lambda r: r.timestamp_ms)
    return rows


def parse_row(line: bytes, number: int = 0) -> TraceRow:
    try:
        record: Any = orjson.loads(line)
        row = TraceRow(
            float(record["timestamp"]),
            int(record["input_length"]),
            int(record["output_length"]),
            _unique_prefix(record["hash_ids"]),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"line {number}: not a Mooncake trace record ({exc})") from exc
    if row.input_length < 1 or row.output_length < 0:
        raise TraceError(f"line {number}: lengths must be positive")
    return row


def _unique_prefix(ids: Sequence[Any]) -> tuple[int, ...]:
    """The ids up to the first repeat (chained ids never repeat within one prompt)."""
    seen: set[int] = set()
    out: list[int] = []
    for value in ids:
        block = int(value)
        if block in seen:
            break
        seen.add(block)
        out.append(block)
    return tuple(out)


def tile(rows: Sequence[TraceRow], copies: int) -> list[TraceRow]:
    """``copies`` disjoint copies of the trace at the same timestamps (``copies`` x the traffic): the same
    workload from more users, with hash ids shifted so that copies share nothing. For scale tests."""
    if copies < 1:
        raise ValueError("copies must be >= 1")
    if copies == 1:
        return list(rows)
    span = 1 + max((max(r.hash_ids, default=0) for r in rows), default=0)
    tiled = [_shifted(row, copy * span) for copy in range(copies) for row in rows]
    tiled.sort(key=lambda r: r.timestamp_ms)
    return tiled


def _shifted(row: TraceRow, offset: int) -> TraceRow:
    ids = tuple(h + offset for h in row.hash_ids)
    return TraceRow(row.timestamp_ms, row.input_length, row.output_length, ids)


def arrival_times(rows: Sequence[TraceRow], rng: random.Random, rate_scale: float = 1.0) -> list[float]:
    """Arrival time in seconds of each row: timestamps / rate_scale, spread within shared buckets."""
    if rate_scale <= 0:
        raise ValueError("rate_scale must be positive")
    bucket = _bucket_ms(rows)
    times: list[float] = []
    for start, width, count in _groups(rows, bucket):
        offsets = sorted(rng.uniform(0.0, width) for _ in range(count)) if count > 1 else [0.0]
        times.extend((start + offset) / 1000.0 / rate_scale for offset in offsets)
    return times


def _bucket_ms(rows: Sequence[TraceRow]) -> float:
    stamps = sorted({r.timestamp_ms for r in rows})
    gaps = [b - a for a, b in pairwise(stamps)]
    return statistics.median(gaps) if gaps else 1000.0


def _groups(rows: Sequence[TraceRow], bucket: float) -> Iterator[tuple[float, float, int]]:
    """(timestamp, spread width, rows) per distinct timestamp."""
    groups = [(ts, len(list(members))) for ts, members in groupby(rows, key=lambda r: r.timestamp_ms)]
    for i, (ts, count) in enumerate(groups):
        following = groups[i + 1][0] if i + 1 < len(groups) else ts + bucket
        yield ts, min(bucket, following - ts), count
