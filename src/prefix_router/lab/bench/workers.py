"""The benchmark's view of the engines: detection, fair cache reset, and counters from ``/metrics``.

Fair warm reset: before each policy every worker's prefix cache is emptied with the engine's own flush
call (vLLM and the simulated engine ``POST /reset_prefix_cache``, SGLang ``POST /flush_cache``), so every
policy starts from the same cache state. Engines without one (llama.cpp, TGI) are reported: restart them
between policies (``demo`` does) or accept that later policies start warm.

Per-worker request counts come from the router's ``x-prefix-router-worker`` header; routers that do not
send it (peers) are measured from the engines' counters (``vllm:request_success_total``) instead, and when
an engine has no request counter, load balance is judged by the prompt tokens each engine was sent
(``vllm:prefix_cache_queries``). Simulated engines also export their busy time, from which a run states
how busy the fleet was (``busy_fraction``; simulated).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from prefix_router.pool import client_session, detect, get_adapter, promtext

REQUEST_COUNTERS = promtext.counter_names("vllm:request_success")
PREEMPTION_COUNTERS = promtext.counter_names("vllm:num_preemptions")
BUSY_COUNTERS = promtext.counter_names("prefix_router_sim:busy_seconds")  # simulated engines only
TIME_SCALE_GAUGE = "prefix_router_sim:time_scale"
MAX_METRICS_BYTES = 8 * 1024 * 1024
SIM_MARKERS = ("prefix-router-sim", "prefix_router_sim", "simulated")


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    url: str
    engine: str
    simulated: bool
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Counters:
    """Cumulative counters of one worker (None where the engine does not expose them)."""

    requests: float | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    busy_s: float | None = None  # engine busy time in wall seconds (simulated engines export it)
    preemptions: float | None = None  # requests the engine evicted from its running batch (vLLM)


async def _get_text(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                return None
            return (await resp.content.read(MAX_METRICS_BYTES)).decode("utf-8", "replace")
    except (aiohttp.ClientError, TimeoutError):
        return None


async def _get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    text = await _get_text(session, url)
    if text is None:
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _session(timeout_s: float = 10.0) -> aiohttp.ClientSession:
    return client_session(aiohttp.ClientTimeout(total=timeout_s))


async def describe(url: str) -> WorkerInfo:
    """Which engine serves ``url`` and whether it is a simulated one."""
    async with _session() as session:
        metrics = await _get_text(session, f"{url}/metrics")
        models = await _get_json(session, f"{url}/v1/models")
    blob = f"{metrics or ''} {models or ''}".lower()
    return WorkerInfo(url, detect(metrics, models), any(m in blob for m in SIM_MARKERS), first_model(models))


def first_model(models: dict[str, Any] | None) -> str | None:
    """The id of the first model a ``/v1/models`` body lists."""
    data = (models or {}).get("data")
    if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("id"), str):
        return str(data[0]["id"])
    return None


async def describe_all(urls: Sequence[str]) -> list[WorkerInfo]:
    return list(await asyncio.gather(*(describe(u) for u in urls)))


async def reset(info: WorkerInfo) -> bool:
    """Empty the worker's prefix cache; False when its engine has no flush call or it failed."""
    flush = get_adapter(info.engine).flush_request()
    paths = [flush.path] if flush else []
    if info.engine == "generic":
        paths = ["/reset_prefix_cache", "/flush_cache"]
    async with _session() as session:
        for path in paths:
            if await _post_ok(session, f"{info.url}{path}", flush.method if flush else "POST"):
                return True
    return False


async def _post_ok(session: aiohttp.ClientSession, url: str, method: str) -> bool:
    try:
        async with session.request(method, url) as resp:
            return 200 <= resp.status < 300
    except (aiohttp.ClientError, TimeoutError):
        return False


async def reset_all(infos: Sequence[WorkerInfo]) -> dict[str, bool]:
    results = await asyncio.gather(*(reset(i) for i in infos))
    return {i.url: ok for i, ok in zip(infos, results, strict=True)}


async def counters(info: WorkerInfo) -> Counters:
    async with _session() as session:
        text = await _get_text(session, f"{info.url}/metrics")
    return Counters() if text is None else from_page(text, info.engine)


def from_page(text: str, engine: str) -> Counters:
    """The counters on one ``/metrics`` page of an engine of kind ``engine``."""
    load = get_adapter(engine).parse_metrics(text)
    samples = promtext.parse(text, frozenset((*REQUEST_COUNTERS, *PREEMPTION_COUNTERS)))
    requests = promtext.total(samples, *REQUEST_COUNTERS)
    preemptions = promtext.total(samples, *PREEMPTION_COUNTERS)
    hits = load.prefix_cache_hits
    return Counters(requests, load.prefix_cache_queries, hits, busy_wall_s(text), preemptions)


def busy_wall_s(text: str) -> float | None:
    """A simulated engine's busy time in wall seconds (model seconds x time scale); None elsewhere."""
    samples = promtext.parse(text, frozenset((*BUSY_COUNTERS, TIME_SCALE_GAUGE)))
    busy = promtext.total(samples, *BUSY_COUNTERS)
    scale = promtext.total(samples, TIME_SCALE_GAUGE)
    return None if busy is None else busy * (scale or 1.0)


async def counters_all(infos: Sequence[WorkerInfo]) -> dict[str, Counters]:
    results = await asyncio.gather(*(counters(i) for i in infos))
    return {i.url: c for i, c in zip(infos, results, strict=True)}


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else max(0.0, after - before)


def _per_worker(
    before: Mapping[str, Counters], after: Mapping[str, Counters], counter: Callable[[Counters], float | None]
) -> dict[str, int] | None:
    """Each worker's rise in ``counter`` between two scrapes, rounded; None unless every worker exposes it."""
    deltas = {url: _delta(counter(after[url]), counter(before[url])) for url in after}
    if any(d is None for d in deltas.values()):
        return None
    return {url: round(d or 0.0) for url, d in deltas.items()}


def requests_delta(before: Mapping[str, Counters], after: Mapping[str, Counters]) -> dict[str, int] | None:
    """Requests each worker served between two scrapes; None unless every worker exposes the counter."""
    return _per_worker(before, after, lambda c: c.requests)


def preemptions_delta(before: Mapping[str, Counters], after: Mapping[str, Counters]) -> dict[str, int] | None:
    """Requests each worker preempted (evicted from its running batch, to be recomputed) between two
    scrapes; None unless every worker exposes the counter."""
    return _per_worker(before, after, lambda c: c.preemptions)


def prompt_tokens_delta(
    before: Mapping[str, Counters], after: Mapping[str, Counters]
) -> dict[str, int] | None:
    """Prompt tokens each worker was asked to prefill (prefix-cache queries) between two scrapes."""
    return _per_worker(before, after, lambda c: c.prefix_queries)


def busy_fraction(
    before: Mapping[str, Counters], after: Mapping[str, Counters], wall_s: float
) -> float | None:
    """Mean fraction of ``wall_s`` the engines spent running steps; None unless every engine says."""
    deltas = [_delta(after[u].busy_s, before[u].busy_s) for u in after]
    if not deltas or wall_s <= 0 or any(d is None for d in deltas):
        return None
    return round(sum(d or 0.0 for d in deltas) / (len(deltas) * wall_s), 4)


def engine_hit_rate(before: Mapping[str, Counters], after: Mapping[str, Counters]) -> float | None:
    """Prefix-cache hits / queries summed over workers between two scrapes (engine metrics)."""
    queries = [_delta(after[u].prefix_queries, before[u].prefix_queries) for u in after]
    hits = [_delta(after[u].prefix_hits, before[u].prefix_hits) for u in after]
    if any(q is None for q in queries) or any(h is None for h in hits):
        return None
    total = sum(q or 0.0 for q in queries)
    return round(sum(h or 0.0 for h in hits) / total, 4) if total else None
