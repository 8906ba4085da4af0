"""The render cache (precise keys without a local template): bounded, keyed by the character key, and
every kind of bad answer leaves the request as it was."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from prefix_router.node.request.parse import parse
from prefix_router.node.request.render import Renders
from prefix_router.node.upstream.seam import UpstreamRequest
from prefix_router.pool import Worker, WorkerSettings
from prefix_router.routing import Router, RoutingSettings


class Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.headers, self._parts = status, {}, [body, b""]

    async def next_chunk(self) -> bytes:
        return self._parts.pop(0)

    def release(self) -> None:
        pass

    def abort(self) -> None:
        pass


class Engine:
    """An upstream whose answer to every render is ``status`` and ``body``."""

    def __init__(self, status: int = 200, body: Any = None) -> None:
        self.status, self.body, self.asked = status, body, 0

    async def send(self, request: UpstreamRequest) -> Answer:
        self.asked += 1
        assert request.url.endswith("/v1/chat/completions/render")
        ids = list(range(1, 1 + len(request.body) // 2))
        body = self.body if self.body is not None else {"token_ids": ids}
        return Answer(self.status, body if isinstance(body, bytes) else orjson.dumps(body))


def setup() -> tuple[Router, Worker]:
    router = Router(
        RoutingSettings.model_validate({"keys": {"mode": "events"}, "events": {"block_tokens": 4}})
    )
    router.add_worker("w")
    router.add_event_worker("w", "m")
    return router, Worker.from_config(WorkerSettings(url="http://127.0.0.1:9", name="w"))


def parsed(router: Router, text: str) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return parse("chat", orjson.dumps(body), router.keys, "r", None, None)


async def test_rendered_ids_are_cached_by_the_character_key_and_bounded() -> None:
    router, worker = setup()
    renders, engine = Renders(capacity=2), Engine()
    for text in ["one " * 20, "two " * 20, "one " * 20, "three " * 20, "one " * 20, "two " * 20]:
        got = await renders.precise(router, engine, worker, parsed(router, text), 1.0, None)
        assert got.req.precise_blocks and got.req.precise_tokens > 0
        assert len(renders) <= 2
    # "two", the least recently used, fell out when "three" came: asked again
    assert (engine.asked, renders.stats.cached) == (4, 2)


@pytest.mark.parametrize(
    "engine",
    [Engine(500), Engine(200, b"not json"), Engine(200, {"token_ids": []}), Engine(200, {"token_ids": [-1]})],
)
async def test_a_bad_render_leaves_the_request_as_it_was(engine: Engine) -> None:
    router, worker = setup()
    renders = Renders(capacity=4)
    before = parsed(router, "hello " * 20)
    after = await renders.precise(router, engine, worker, before, 1.0, None)
    assert after is before and renders.stats.failures == 1
