"""Replay of users' own recorded requests from a JSONL request trace.

Format: one JSON object per line::

    {"timestamp": 12.5, "session": "conv-42", "endpoint": "chat", "body": {"model": "...", "messages": [...]}}

- ``timestamp`` (required): seconds since the start of the recording (any origin: the first becomes 0).
- ``session`` (optional): requests with the same session are sent in timestamp order, each once the
  previous one has returned; without it a request is its own session.
- ``endpoint``: ``chat`` or ``completions`` (``/v1/chat/completions`` and ``/v1/completions`` also accepted).
- ``body``: the OpenAI request body, sent as recorded, except ``model`` (replaced when the benchmark is
  given one) and the streaming options (the runner always streams with usage).

Arrivals default to the recorded timestamps (scale them with the ``trace`` arrival's ``time_scale``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from prefix_router.lab.workloads.settings import WorkloadSettings
from prefix_router.lab.workloads.types import Session, Turn
from prefix_router.protocol import Endpoint

_ENDPOINTS: dict[str, Endpoint] = {
    "chat": "chat",
    "/v1/chat/completions": "chat",
    "completions": "completions",
    "/v1/completions": "completions",
}


class TraceFileSettings(WorkloadSettings):
    path: str = ""
    default_max_tokens: int = 128  # when a body sets neither max_tokens nor max_completion_tokens


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp: float
    session: str | None
    endpoint: Endpoint
    body: dict[str, Any]


def parse_record(line: bytes, number: int) -> TraceRecord:
    raw = orjson.loads(line)
    endpoint = _ENDPOINTS.get(str(raw.get("endpoint", "chat")))
    if endpoint is None or not isinstance(raw.get("body"), dict) or "timestamp" not in raw:
        raise ValueError(f"line {number}: need timestamp, endpoint (chat|completions) and an object body")
    session = raw.get("session")
    return TraceRecord(
        float(raw["timestamp"]), None if session is None else str(session), endpoint, raw["body"]
    )


def read_records(path: Path) -> list[TraceRecord]:
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    return sorted((parse_record(line, n) for n, line in enumerate(lines, 1)), key=lambda r: r.timestamp)


def build(opts: TraceFileSettings, requests: int, seed: int) -> list[Session]:
    del seed  # replay is fully determined by the file
    if not opts.path:
        raise ValueError("the trace workload needs path=FILE (a JSONL request trace)")
    records = read_records(Path(opts.path))[:requests]
    return group_sessions(records, opts.default_max_tokens)


def group_sessions(records: Iterable[TraceRecord], default_max_tokens: int) -> list[Session]:
    groups: dict[str, list[TraceRecord]] = {}
    for index, record in enumerate(records):
        groups.setdefault(record.session or f"request-{index}", []).append(record)
    start = min((g[0].timestamp for g in groups.values()), default=0.0)
    return [_session(sid, group, start, default_max_tokens) for sid, group in groups.items()]


def _session(session_id: str, group: list[TraceRecord], start: float, default_max_tokens: int) -> Session:
    turns = tuple(Turn(max_tokens=_max_tokens(r.body, default_max_tokens), body=r.body) for r in group)
    return Session(session_id, group[0].timestamp - start, turns, endpoint=group[0].endpoint)


def _max_tokens(body: dict[str, Any], default: int) -> int:
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    return int(value) if isinstance(value, int | float) else default
