"""A fleet to look at (SIMULATED): ``n`` simulated engines (``engine-sim``, named ``sim-0`` ...) behind a
real ``serve`` app with an admin token and a few tenants' keys, on an event loop in a thread of its own,
with optional traffic from those tenants (a system prompt per tenant, a new question each time).

Used where something blocking must watch a live router: the dashboard's browser tests (selenium's calls
block), the screenshots of the docs (``benchmarks/dashboard_shots.py``) and the dashboard's cost
benchmark (``benchmarks/dashboard_cost.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import aiohttp

from prefix_router.lab.sim.server import EngineSimSettings, running_server
from prefix_router.node import load_config
from prefix_router.proxy import Running, create_app, start

ADMIN_TOKEN = "showcase-admin-token-7f3e9c"
TENANT_KEYS = ("tenant-key-alpha-1d9", "tenant-key-beta-5c2", "tenant-key-gamma-88a")
MODEL = "sim-demo"
SYSTEM = "You are the assistant of tenant {tenant}. Answer briefly and to the point, always. "
# no background identification or scrape beyond the start-up round; health probes every half second
QUIET = {"health.interval_s": 0.5, "health.timeout_s": 0.5, "health.models_interval_s": 3600,
         "scrape.interval_s": 3600}  # fmt: skip
T = TypeVar("T")


class Showcase:
    """The fleet and its router; ``call`` runs a coroutine on their loop and waits for it."""

    def __init__(self, n: int, settings: dict[str, Any] | None = None, time_scale: float = 0.02) -> None:
        self.n = n
        self.settings = settings or {}
        self.time_scale = time_scale
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.engines: dict[str, contextlib.AsyncExitStack] = {}
        self.urls: dict[str, str] = {}
        self.running: Running | None = None
        self.traffic: list[asyncio.Task[None]] = []
        self.sent = 0
        self.answered = 0

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    @property
    def url(self) -> str:
        assert self.running is not None
        return self.running.url

    def start(self) -> None:
        self.thread.start()
        self.call(self._start())

    async def _start(self) -> None:
        for i in range(self.n):
            stack = contextlib.AsyncExitStack()
            settings = EngineSimSettings(profile="cpu-demo", time_scale=self.time_scale)
            url = await stack.enter_async_context(running_server(settings))
            self.engines[f"sim-{i}"], self.urls[f"sim-{i}"] = stack, url
        overrides = {
            **QUIET,
            "auth.admin_token": ADMIN_TOKEN,
            "auth.api_keys": list(TENANT_KEYS),
            "workers": [{"url": url, "name": name} for name, url in self.urls.items()],
            **self.settings,
        }
        config = load_config(env={}, overrides=overrides)
        self.running = await start(create_app(config), shutdown_timeout=0.2)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _stop(self) -> None:
        for task in self.traffic:
            task.cancel()
        for task in self.traffic:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.running is not None:
            await self.running.stop()
        for stack in self.engines.values():
            await stack.aclose()

    def kill(self, name: str) -> None:
        """Stop engine ``name``: its port refuses connections from now on."""
        self.call(self.engines.pop(name).aclose())

    def start_traffic(self, clients: int = 2, pause_s: float = 0.05) -> None:
        """``clients`` closed loops of requests, each ``pause_s`` after the last answer."""
        self.call(self._spawn(clients, pause_s))

    async def _spawn(self, clients: int, pause_s: float) -> None:
        for _ in range(clients):
            self.traffic.append(asyncio.create_task(self._loop(pause_s)))

    async def _loop(self, pause_s: float) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                if await self.ask(http, self.sent) == 200:
                    self.answered += 1
                await asyncio.sleep(pause_s)

    async def ask(self, http: aiohttp.ClientSession, i: int) -> int:
        """One chat request of tenant ``i % len(TENANT_KEYS)``: its status (0: no answer)."""
        tenant = i % len(TENANT_KEYS)
        self.sent += 1
        body = {
            "model": MODEL,
            "max_tokens": 4,
            "messages": [
                {"role": "system", "content": SYSTEM.format(tenant=tenant) * 12},
                {"role": "user", "content": f"question {i}"},
            ],
        }
        headers = {"Authorization": f"Bearer {TENANT_KEYS[tenant]}"}
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            timeout = aiohttp.ClientTimeout(total=10)
            async with http.post(
                self.url + "/v1/chat/completions", json=body, headers=headers, timeout=timeout
            ) as resp:
                await resp.read()
                return resp.status
        return 0

    def admin(self, method: str, path: str, token: str | None = ADMIN_TOKEN) -> tuple[int, bytes]:
        """An admin call (``token`` None: without one): (status, body)."""
        return self.call(self._admin(method, path, token))

    async def _admin(self, method: str, path: str, token: str | None) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            aiohttp.ClientSession() as http,
            http.request(method, self.url + path, headers=headers) as r,
        ):
            return r.status, await r.read()


@contextlib.contextmanager
def showcase(n: int, settings: dict[str, Any] | None = None, time_scale: float = 0.02) -> Iterator[Showcase]:
    """A started ``Showcase``, stopped on exit."""
    fleet = Showcase(n, settings, time_scale)
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.stop()
