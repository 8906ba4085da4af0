"""Answering a generation request: wait for the engine, then one JSON body or a stream of SSE chunks."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from prefix_router.lab.sim.driver import Ticket
from prefix_router.lab.sim.openai_api import ApiRequest, chunk, full_response, usage, usage_chunk
from prefix_router.lab.sim.text import ids_text


def total_usage(api: ApiRequest, tickets: Sequence[Ticket]) -> dict[str, Any]:
    prompt = sum(g.request.prompt_tokens for g in api.generations)
    completion = sum(t.generated for t in tickets)
    return usage(prompt, completion, sum(t.cached_tokens for t in tickets))


async def complete(
    api: ApiRequest,
    request_id: str,
    tickets: Sequence[Ticket],
    extra: Callable[[], Mapping[str, Any]] | None = None,
) -> web.Response:
    """Wait for every generation, then answer with the whole completion (plus the top-level fields
    ``extra`` returns once they are done: a prefill's ``kv_transfer_params``)."""
    changed = tickets[0].changed
    while not all(t.done for t in tickets):
        await changed.wait()
        changed.clear()
    texts = [ids_text(g.output) for g in api.generations]
    body = full_response(api, request_id, texts, total_usage(api, tickets))
    if extra is not None:
        body |= extra()
    return web.Response(body=orjson.dumps(body), content_type="application/json")


@dataclass(slots=True)
class _Progress:
    emitted: list[int]
    started: list[bool]
    closed: list[bool] = field(default_factory=list)


async def stream(
    request: web.Request, api: ApiRequest, request_id: str, tickets: Sequence[Ticket]
) -> web.StreamResponse:
    """Server-sent events: deltas as the engine produces tokens, a closing chunk, usage, ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    n = len(tickets)
    progress = _Progress([0] * n, [False] * n, [False] * n)
    changed = tickets[0].changed
    try:
        while not all(progress.closed):
            await changed.wait()
            changed.clear()
            await _send_progress(response, api, request_id, tickets, progress)
        if api.include_usage:
            await _send(response, usage_chunk(api, request_id, total_usage(api, tickets)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:
        pass
    return response


async def _send_progress(
    response: web.StreamResponse,
    api: ApiRequest,
    request_id: str,
    tickets: Sequence[Ticket],
    progress: _Progress,
) -> None:
    for i, (generation, ticket) in enumerate(zip(api.generations, tickets, strict=True)):
        if ticket.generated > progress.emitted[i]:
            text = ids_text(generation.output[progress.emitted[i] : ticket.generated])
            first = not progress.started[i]
            await _send(response, chunk(api, request_id, i, text, None, first))
            progress.emitted[i] = ticket.generated
            progress.started[i] = True
        if ticket.done and not progress.closed[i]:
            await _send(response, chunk(api, request_id, i, None, generation.finish_reason))
            progress.closed[i] = True


async def _send(response: web.StreamResponse, body: dict[str, Any]) -> None:
    await response.write(b"data: " + orjson.dumps(body) + b"\n\n")
