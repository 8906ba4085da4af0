"""Token parity without a local template: the engine renders the request (precise mode).

A request whose model has no local chat template (``routing.keys.templates``) has no precise key
(``RouteRequest.precise_blocks``), so it could only be routed on the approximate view. When some worker is
event-fed and ``routing.events.render`` is on, one such worker serving the model (the first fresh one)
is asked for the prompt's token ids: ``POST /v1/chat/completions/render`` or ``/v1/completions/render``
(vLLM; the answer's ``token_ids``), within ``RENDER_TIMEOUT_S``. The ids are cached by the request's
character key (its namespace, last block and tail: two requests of one key render alike), at most
``MAX_RENDERED`` entries, least recently used first out. Any failure (no such worker, an error status,
a timeout, an answer without ids) leaves the request as it was: routed on the approximate view. Cost:
``Renders.stats`` (requests, cache hits, failures, seconds spent), on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from prefix_router.node.request import forward
from prefix_router.node.request.parse import Parsed
from prefix_router.node.upstream.seam import Upstream, UpstreamError, UpstreamRequest
from prefix_router.pool import Worker
from prefix_router.routing import Router

log = logging.getLogger(__name__)
MAX_RENDER_BYTES = 16 * 1024 * 1024
PATHS = {"chat": "/v1/chat/completions/render", "completions": "/v1/completions/render"}
# the longest a render may take before the request is routed on the approximate view: a render is a
# template and a tokenizer run on the engine's CPU, milliseconds even for long prompts
RENDER_TIMEOUT_S = 2.0
# rendered token ids cached by the request's character key: a conversation's next turn hits its entry
MAX_RENDERED = 10_000


@dataclass(slots=True)
class RenderStats:
    requests: int = 0  # asked an engine
    cached: int = 0  # answered from the cache
    failures: int = 0
    seconds: float = 0.0  # spent asking, in all


class Renders:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[tuple[int, int, bytes, int], tuple[int, ...]] = OrderedDict()
        self.stats = RenderStats()

    def __len__(self) -> int:
        return len(self._ids)

    async def precise(
        self,
        router: Router,
        upstream: Upstream,
        worker: Worker | None,
        parsed: Parsed,
        timeout_s: float,
        engine_salt: str | None,
    ) -> Parsed:
        """``parsed`` with a precise key from ``worker``'s rendering (cached), or as it was."""
        req = parsed.req
        key = (
            req.namespace,
            req.blocks[-1] if req.blocks else req.hash_key,
            req.tail,
            req.key_tokens,
        )
        ids = self._ids.get(key)
        if ids is not None:
            self._ids.move_to_end(key)
            self.stats.cached += 1
        elif worker is not None:
            ids = await self._ask(upstream, worker, parsed, timeout_s)
            if ids is not None:
                self._ids[key] = ids
                if len(self._ids) > self.capacity:
                    self._ids.popitem(last=False)
        if not ids:
            return parsed
        blocks = router.keys.precise_blocks(ids, parsed.body, parsed.tenant, engine_salt)
        if not blocks:
            return parsed
        return dataclasses.replace(
            parsed, req=dataclasses.replace(req, precise_blocks=blocks, precise_tokens=len(ids))
        )

    async def _ask(
        self, upstream: Upstream, worker: Worker, parsed: Parsed, timeout_s: float
    ) -> tuple[int, ...] | None:
        self.stats.requests += 1
        started = time.perf_counter()
        headers = {"Content-Type": "application/json"}
        if worker.api_key is not None:
            headers["Authorization"] = f"Bearer {worker.api_key.get_secret_value()}"
        request = UpstreamRequest(
            "POST", forward.upstream_url(worker, PATHS[parsed.endpoint]), headers, parsed.raw
        )
        try:
            answer = await asyncio.wait_for(_fetch(upstream, request), timeout_s)
        except (TimeoutError, UpstreamError, OSError) as exc:
            answer = None
            log.debug("render by %s failed: %s", worker.name, type(exc).__name__)
        finally:
            self.stats.seconds += time.perf_counter() - started
        ids = _token_ids(answer)
        if ids is None:
            self.stats.failures += 1
        return ids


async def _fetch(upstream: Upstream, request: UpstreamRequest) -> Any:
    response = await upstream.send(request)
    try:
        parts, size = [], 0
        while size <= MAX_RENDER_BYTES:
            chunk = await response.next_chunk()
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        else:
            return None
    finally:
        response.release()
    if response.status != 200:
        return None
    try:
        return orjson.loads(b"".join(parts))
    except orjson.JSONDecodeError:
        return None


def _token_ids(answer: Any) -> tuple[int, ...] | None:
    """The ids of a render answer: ``{"token_ids": [...]}``, or a list of such (a completions batch: the
    first prompt's, as the router keys a batch by its first prompt)."""
    if isinstance(answer, list) and answer:
        answer = answer[0]
    ids = answer.get("token_ids") if isinstance(answer, dict) else None
    if not isinstance(ids, list) or not ids or not all(type(t) is int and 0 <= t < 1 << 32 for t in ids):
        return None
    return tuple(ids)


def render_worker(router: Router, candidates: list[Worker], now: float) -> Worker | None:
    """The first fresh event-fed worker among ``candidates`` (the model's available workers)."""
    return next((w for w in candidates if router.precise.fresh(w.name, now)), None)


class RenderCollector(Collector):
    """``/metrics``: what rendering costs (requests asked, answered from the cache, failed; seconds)."""

    def __init__(self, renders: Renders) -> None:
        self.renders = renders

    def collect(self) -> Iterator[Metric]:
        stats = self.renders.stats
        counts = CounterMetricFamily(
            "prefix_router_render_requests",
            "Requests without a local template rendered by an event-fed engine (asked, cached, failed)",
            labels=["outcome"],
        )
        for outcome, value in (
            ("asked", stats.requests),
            ("cached", stats.cached),
            ("failed", stats.failures),
        ):
            counts.add_metric([outcome], value)
        seconds = CounterMetricFamily(
            "prefix_router_render_seconds", "Seconds spent asking engines to render"
        )
        seconds.add_metric([], stats.seconds)
        yield from (counts, seconds)
