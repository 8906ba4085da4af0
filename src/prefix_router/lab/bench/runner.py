"""Replays a ``Workload`` against an OpenAI-compatible base URL (a router or one engine), client-side.

Sessions start at their ``arrival_s`` (open loop) or as soon as one of ``workload.concurrency`` slots frees
(closed loop); within a session each turn is sent after the previous answer returned (plus the turn's
``think_time_s``), with the history carried forward: the turn's messages, then its ``scripted_reply`` or the
generated reply. At most ``max_in_flight`` sessions run at once in open loop (later arrivals wait, and
their wait is not counted in TTFT). A session stops at its first failed turn. With ``duration_s`` no turn
starts after that many seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2
from openai import AsyncOpenAI
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prefix_router.lab.bench.client import RequestRecord, send
from prefix_router.lab.workloads.bodies import request_body
from prefix_router.lab.workloads.types import Session, Turn, Workload


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    base_url: str
    model: str = "default"
    api_key: str = "EMPTY"
    timeout_s: float = 600.0
    max_in_flight: int = 256
    duration_s: float | None = None
    progress: bool = True
    label: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    tenant_header: str | None = None  # send Session.tenant in this header (prefix-router reads tenants
    # from the bearer token, so by default tenants are not sent)
    # send the session id of multi-turn sessions in this header (prefix-router: ``x-session-id``). Off by
    # default: prefix-router applies session affinity before *any* policy, so random would not be random.
    session_header: str | None = None


@dataclass(slots=True)
class RunResult:
    records: list[RequestRecord]
    wall_s: float


@dataclass(slots=True)
class _Run:
    cfg: RunnerSettings
    client: AsyncOpenAI
    start: float
    slots: asyncio.Semaphore
    records: list[RequestRecord]
    on_record: Callable[[RequestRecord], None]

    def expired(self) -> bool:
        limit = self.cfg.duration_s
        return limit is not None and time.perf_counter() - self.start >= limit


def openai_base(url: str) -> str:
    """``http://host:port`` or ``.../v1`` -> the ``.../v1`` base the OpenAI client wants."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def make_client(cfg: RunnerSettings, connections: int) -> AsyncOpenAI:
    limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
    http = httpx2.AsyncClient(limits=limits, timeout=cfg.timeout_s)
    return AsyncOpenAI(
        base_url=openai_base(cfg.base_url),
        api_key=cfg.api_key,
        max_retries=0,
        timeout=cfg.timeout_s,
        http_client=http,
    )


async def run_workload(workload: Workload, cfg: RunnerSettings) -> RunResult:
    """Replay ``workload``; one record per request sent (bounded by ``workload.request_count``)."""
    width = workload.concurrency or cfg.max_in_flight
    if width < 1:
        raise ValueError("concurrency and max_in_flight must be >= 1")
    client = make_client(cfg, width)
    records: list[RequestRecord] = []
    with _progress(cfg, workload.request_count) as advance:
        run = _Run(cfg, client, time.perf_counter(), asyncio.Semaphore(width), records, advance)
        try:
            await asyncio.gather(*(_session(run, s) for s in workload.sessions))
        finally:
            await client.close()
    return RunResult(records, time.perf_counter() - run.start)


async def _session(run: _Run, session: Session) -> None:
    limit = run.cfg.duration_s
    if limit is not None and session.arrival_s >= limit:
        return
    delay = run.start + session.arrival_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    async with run.slots:
        history: list[dict[str, Any]] = list(session.preamble)
        for index, turn in enumerate(session.turns):
            if turn.think_time_s > 0:
                await asyncio.sleep(turn.think_time_s)
            if run.expired() or not await _turn(run, session, index, turn, history):
                return


async def _turn(run: _Run, session: Session, index: int, turn: Turn, history: list[dict[str, Any]]) -> bool:
    """Send one turn and extend ``history``; False when it failed (the session then stops)."""
    start = time.perf_counter() - run.start
    record = RequestRecord(session.session_id, index, session.endpoint, start)
    reply = await send(run.client, session.endpoint, request_body(session, turn, history, run.cfg.model),
                       _headers(run.cfg, session), record)  # fmt: skip
    run.records.append(record)
    run.on_record(record)
    if record.ok and turn.body is None:
        history.extend(turn.messages)
        history.append(turn.scripted_reply or reply or {"role": "assistant", "content": ""})
    return record.ok


def _headers(cfg: RunnerSettings, session: Session) -> dict[str, str]:
    headers = dict(cfg.headers)
    if cfg.tenant_header and session.tenant:
        headers[cfg.tenant_header] = session.tenant
    if cfg.session_header and len(session.turns) > 1:
        headers[cfg.session_header] = session.session_id
    return headers


class _progress:
    """A rich progress bar (or nothing) yielding an ``advance(record)`` callback."""

    def __init__(self, cfg: RunnerSettings, total: int) -> None:
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("errors {task.fields[errors]}"), TimeElapsedColumn(),
                            disable=not cfg.progress)  # fmt: skip
        self.task = self.bar.add_task(cfg.label or cfg.base_url, total=total, errors=0)
        self.errors = 0

    def __enter__(self) -> Callable[[RequestRecord], None]:
        self.bar.__enter__()
        return self.advance

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(None, None, None)

    def advance(self, record: RequestRecord) -> None:
        self.errors += 0 if record.ok else 1
        self.bar.update(self.task, advance=1, errors=self.errors)
