"""A loopback stand-in for the Kubernetes API server, replaying recorded EndpointSlice responses."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes.client import ApiClient, Configuration, DiscoveryV1Api

from prefix_router.node.life.server import Running, start

FIXTURES = Path(__file__).parent / "fixtures"
PATH = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"


def fixture_json(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def fixture_lines(name: str) -> list[str]:
    return [line for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


class FakeApiServer:
    """Answers list calls with ``lists`` (the last one repeats) and watch calls with ``watches`` (each a
    list of JSON lines, streamed then closed; when none is left the watch stays open, idle, until
    ``timeoutSeconds``). ``fail_next`` answers that many calls with a 500 Status."""

    def __init__(self) -> None:
        self.lists: list[Any] = []
        self.watches: list[list[str]] = []
        self.fail_next = 0
        self.requests: list[dict[str, str]] = []
        self.running: Running | None = None

    @property
    def url(self) -> str:
        assert self.running is not None
        return self.running.url

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(PATH, self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query) | {"namespace": request.match_info["namespace"]}
        self.requests.append(query)
        if self.fail_next > 0:
            self.fail_next -= 1
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": 500,
                "reason": "Internal",
            }
            return web.json_response(status, status=500)
        if query.get("watch") == "true":
            return await self._watch(request, float(query.get("timeoutSeconds", "1")))
        return web.json_response(self.lists[0] if len(self.lists) == 1 else self.lists.pop(0))

    async def _watch(self, request: web.Request, timeout_s: float) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        if self.watches:
            for line in self.watches.pop(0):
                await resp.write(line.encode() + b"\n")
        else:
            await asyncio.sleep(min(timeout_s, 0.5))
        await resp.write_eof()
        return resp

    def client(self) -> DiscoveryV1Api:
        return DiscoveryV1Api(ApiClient(Configuration(host=self.url)))

    def watch_requests(self) -> list[dict[str, str]]:
        return [r for r in self.requests if r.get("watch") == "true"]

    def list_requests(self) -> list[dict[str, str]]:
        return [r for r in self.requests if r.get("watch") != "true"]


@pytest.fixture
async def api_server() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()
    server.running = await start(server.app(), shutdown_timeout=0.1)
    try:
        yield server
    finally:
        await server.running.stop()


class Recorder:
    """A discovery listener that remembers every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def on_add(self, url: str) -> None:
        self.calls.append(("add", url))

    def on_remove(self, url: str) -> None:
        self.calls.append(("remove", url))


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def fixtures() -> Any:
    class Fixtures:
        json = staticmethod(fixture_json)
        lines = staticmethod(fixture_lines)

    return Fixtures
