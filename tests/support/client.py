"""A client's view of a router over HTTP: a chat body sent, and what the answer's headers say of its
routing."""

from __future__ import annotations

from typing import Any

import aiohttp

from prefix_router.protocol import MATCH_HEADER, WORKER_HEADER

CHAT_PATH = "/v1/chat/completions"


async def routed(
    url: str, body: dict[str, Any], http: aiohttp.ClientSession | None = None
) -> tuple[str, int]:
    """POST ``body`` to the router at ``url`` (on ``http``, else on a session of its own) and read the
    whole answer: (the worker it went to, the tokens the router predicted cached there). Fails the test
    on any status but 200."""
    if http is None:
        async with aiohttp.ClientSession() as own:
            return await routed(url, body, own)
    async with http.post(url + CHAT_PATH, json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return resp.headers[WORKER_HEADER], int(resp.headers[MATCH_HEADER])
