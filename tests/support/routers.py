"""Real router apps (``create_app``) served on 127.0.0.1 in front of test engines, as ``serve`` runs them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from openai import AsyncOpenAI

from prefix_router.node.config import load_config
from prefix_router.node.life.server import Running, start
from prefix_router.node.state import STATE, NodeState
from prefix_router.node.upstream.seam import Upstream
from prefix_router.pool.http import Fetched
from prefix_router.proxy.run.app import create_app

# no background probe, identification or scrape during a test: only the start-up round
QUIET = {"health.interval_s": 3600, "health.models_interval_s": 3600, "scrape.interval_s": 3600}


def openai_client(url: str, clients: list[AsyncOpenAI], api_key: str, **kwargs: Any) -> AsyncOpenAI:
    """An OpenAI client of ``url`` kept in ``clients``, for its owner to close at the test's end: a client
    left to the garbage collector closes itself on whatever loop runs then, a later test's, where the
    close fails ("Event loop is closed") and logs that test a traceback."""
    client = AsyncOpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, **kwargs)
    clients.append(client)
    return client


async def close_clients(clients: list[AsyncOpenAI]) -> None:
    while clients:
        await clients.pop().close()


@dataclass
class RouterHandle:
    app: web.Application
    running: Running
    clients: list[AsyncOpenAI] = field(default_factory=list)  # ``openai``'s, closed with the router

    @property
    def url(self) -> str:
        return self.running.url

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def state(self) -> NodeState:
        return self.app[STATE]

    def openai(self, api_key: str = "unused", **kwargs: Any) -> AsyncOpenAI:
        return openai_client(self.url, self.clients, api_key, **kwargs)

    def admit(self, name: str) -> None:
        """Admit a worker as if its first probe had passed (one that is down by the time of the test:
        an engine that died after start-up)."""
        self.state.pool.report(self.state.pool.require(name), True)


class UpFetcher:
    """The probes' side of an in-memory network (``upstream=``): every worker answers 200 ``{}``."""

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float, max_bytes: int) -> Fetched:
        return Fetched(200, b"{}")


RouterFactory = Callable[..., Awaitable[RouterHandle]]


def worker_entry(worker: Any, models: Sequence[str] | None = None) -> Any:
    """A ``workers:`` entry: config entries (URL or dict) as they are, engines by their URL and name."""
    if isinstance(worker, str | dict):
        return worker
    entry = {"url": worker.url, "name": worker.name}
    return entry | ({"models": list(models)} if models is not None else {})


class Routers:
    """Starts routers (``start``) and stops every one of them (``close``).

    ``models``: the models every engine given as an object is configured with (None: identified at start).
    """

    def __init__(self, shutdown_timeout_s: float = 0.2, models: Sequence[str] | None = None) -> None:
        self.shutdown_timeout_s = shutdown_timeout_s
        self.models = models
        self.handles: list[RouterHandle] = []

    async def start(
        self, *workers: Any, settings: dict[str, Any] | None = None, upstream: Upstream | None = None
    ) -> RouterHandle:
        """A router in front of ``workers`` with ``QUIET`` and then ``settings`` as config overrides."""
        entries = [worker_entry(w, self.models) for w in workers]
        config = load_config(env={}, overrides={**QUIET, "workers": entries, **(settings or {})})
        app = create_app(config, upstream=upstream, fetcher=UpFetcher() if upstream is not None else None)
        running = await start(
            app, shutdown_timeout=self.shutdown_timeout_s, keepalive_timeout=config.timeouts.client_header_s
        )
        self.handles.append(RouterHandle(app, running))
        return self.handles[-1]

    async def close(self) -> None:
        for handle in self.handles:
            await close_clients(handle.clients)
            await handle.running.stop()
        self.handles.clear()
