"""The helpers a test folder hands its tests through its ``kit`` fixture (the folder's conftest returns one
of these classes): ``ReliabilityKit``, ``SecurityKit``, ``ReplicationKit`` and ``SimKit``. The two that talk
HTTP to a router share ``HttpKit``."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, ClassVar

import aiohttp
import orjson
import psutil
import xxhash

from prefix_router.lab.sim.engine import EngineModel, EngineRequest
from prefix_router.protocol import POLICY_HEADER
from prefix_router.replication import ReplicationSettings
from prefix_router.routing.router import Router
from prefix_router.routing.types import Outcome, RouteRequest
from support.bodies import ask
from support.routers import RouterHandle
from support.routing import new_router, prefix, route_request
from support.waiting import wait_until

CHAT_PATH = "/v1/chat/completions"
POST_TIMEOUT_S = 20


class HttpKit:
    """Requests to a router and its answers read back. ``CHAT``: the body ``post`` sends by default."""

    CHAT: ClassVar[dict[str, Any]]  # each kit's own
    wait_until = staticmethod(wait_until)

    @classmethod
    async def post(
        cls, url: str, body: Any = None, headers: dict[str, str] | None = None, path: str = CHAT_PATH
    ) -> tuple[int, Any, bytes]:
        """POST ``body`` to ``url + path`` (JSON; bytes as they are; ``CHAT`` when None): (status, headers,
        raw body)."""
        data = body if isinstance(body, bytes) else orjson.dumps(cls.CHAT if body is None else body)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=POST_TIMEOUT_S)) as http:
            resp = await http.post(url + path, data=data, headers=headers)
            return resp.status, resp.headers, await resp.read()

    @staticmethod
    def events(raw: bytes) -> list[bytes]:
        """The ``data:`` payloads of an SSE body."""
        return [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.startswith(b"data: ")]


class ReliabilityKit(HttpKit):
    """Fault tests: a router's sockets and whether anything is still in flight. ``RR``: the headers that
    ask for round robin."""

    CHAT: ClassVar[dict[str, Any]] = ask("tell me a story " * 20)
    RR: ClassVar[dict[str, str]] = {POLICY_HEADER: "round_robin"}

    @staticmethod
    def client_sockets(port: int) -> list[Any]:
        """This process's TCP sockets connected to ``port`` (the router's side of upstream connections)."""
        return [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port == port]

    @staticmethod
    def lingering_sockets(port: int) -> list[Any]:
        """Sockets to ``port`` the peer already closed but this process kept open: a leak."""
        return [c for c in ReliabilityKit.client_sockets(port) if c.status == psutil.CONN_CLOSE_WAIT]

    @staticmethod
    def quiescent(router: RouterHandle) -> bool:
        """Nothing in flight anywhere: the pool, each worker, the routing core, the deadline registry."""
        state = router.state
        return (
            state.pool.total_in_flight() == 0
            and all(state.pool.in_flight(w.name) == 0 for w in state.pool)
            and state.router.load.tracked() == 0
            and len(state.deadlines) == 0
        )


class SecurityKit(HttpKit):
    """Security tests: raw bytes on a socket, configurations ``serve`` must refuse and OpenAI errors.
    ``ANY``: a body that every generation endpoint accepts."""

    CHAT: ClassVar[dict[str, Any]] = ask("hello there " * 10)
    ANY: ClassVar[dict[str, Any]] = {**CHAT, "prompt": "hello there " * 10, "input": "hello"}

    @staticmethod
    async def raw(port: int, data: bytes, timeout_s: float = 10.0, pause_s: float = 0.0) -> bytes:
        """Send raw bytes (in pieces ``pause_s`` apart when ``data`` is split with b"|PAUSE|") and read
        until the router closes the connection or ``timeout_s``; returns what came back (``<cut>`` when
        the router hung up on a request without a word)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        received = bytearray()
        try:
            for i, piece in enumerate(data.split(b"|PAUSE|")):
                if i:
                    await asyncio.sleep(pause_s)
                writer.write(piece)
                await writer.drain()
            await asyncio.wait_for(_read_all(reader, received), timeout_s)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()
        return bytes(received) or b"<cut>"

    @staticmethod
    def status_of(response: bytes) -> int:
        """The status code of a raw HTTP response (0 if there is none)."""
        parts = response.split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() else 0

    @staticmethod
    async def refused_config(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        """Run ``serve`` with a configuration it must refuse: (exit code, stderr)."""
        argv = ["-m", "prefix_router.proxy", "serve", "--port", "0", *args]
        process = await asyncio.create_subprocess_exec(
            sys.executable, *argv, stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})}
        )
        try:
            _, err = await asyncio.wait_for(process.communicate(), 30)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        return int(process.returncode or 0), err.decode()

    @staticmethod
    def openai_error(raw: bytes) -> dict[str, Any]:
        body = orjson.loads(raw)
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        error: dict[str, Any] = body["error"]
        return error


async def _read_all(reader: asyncio.StreamReader, into: bytearray) -> None:
    while chunk := await reader.read(65536):
        into += chunk


class ReplicationKit:
    """Replication tests: routing cores over ``WORKERS`` that replicas share, and requests through them."""

    WORKERS = ("w0", "w1", "w2", "w3")
    wait_until = staticmethod(wait_until)
    prefix = staticmethod(prefix)

    @staticmethod
    def make_router(seed: int = 0, **knobs: object) -> Router:
        settings = {"keys": {"block_tokens": 16}, "index": {"worker_capacity_tokens": 16 * 10_000}, **knobs}
        return new_router(settings, ReplicationKit.WORKERS, seed)

    @staticmethod
    def fast_config(**changes: object) -> ReplicationSettings:
        base: dict[str, object] = dict(
            read_block_ms=50, load_interval_s=0.05, load_ttl_s=1.0, backoff_initial_s=0.02, backoff_max_s=0.2,
            op_timeout_s=0.5, connect_timeout_s=0.5, warmup_timeout_s=2.0,
        )  # fmt: skip
        base.update(changes)
        return ReplicationSettings(**base)  # type: ignore[arg-type]

    @staticmethod
    def request(rid: str, blocks: tuple[int, ...]) -> RouteRequest:
        return route_request(rid, blocks, tail=3)

    @staticmethod
    def dispatch(
        router: Router,
        rid: str,
        blocks: tuple[int, ...],
        now: float,
        finish: bool = True,
        candidates: list[str] | None = None,
    ) -> str:
        """Route and dispatch one request (the index insert is shared); optionally finish it."""
        req = ReplicationKit.request(rid, blocks)
        decision = router.route(req, candidates or list(ReplicationKit.WORKERS), now)
        router.dispatched(req, decision, now)
        if finish:
            router.finished(req, decision.worker, Outcome(), now)
        return decision.worker


SimEvent = tuple[str, str, float, int]  # (kind, request id, time, cached tokens)


class SimKit:
    """Simulator tests: fake block chains, requests of them and an engine model run until idle."""

    @staticmethod
    def chain(prefix: str, count: int, start: int = 0) -> tuple[int, ...]:
        """Distinct fake block hashes: ``chain("a", 3)`` shares nothing with ``chain("b", 3)``."""
        return tuple(xxhash.xxh3_64_intdigest(f"{prefix}/{i}".encode()) for i in range(start, start + count))

    @staticmethod
    def request(
        rid: str, blocks: tuple[int, ...], block_tokens: int, output: int = 4, extra: int = 8
    ) -> EngineRequest:
        """A request whose prompt is ``blocks`` full blocks plus ``extra`` tokens."""
        return EngineRequest(rid, len(blocks) * block_tokens + extra, output, blocks)

    @staticmethod
    def run_until_idle(engine: EngineModel, limit: int = 100_000) -> list[SimEvent]:
        """Advance until the engine is idle; returns (kind, request id, time, cached tokens) events."""
        events: list[SimEvent] = []
        for _ in range(limit):
            if engine.next_time() is None:
                return events
            events.extend((e.kind, e.request_id, e.time, e.cached_tokens) for e in engine.advance())
        raise AssertionError("engine did not go idle")

    @staticmethod
    def run_one(engine: EngineModel, req: EngineRequest, now: float) -> tuple[float, float, int]:
        """Submit ``req`` at ``now`` on an idle engine and run it: (ttft, end time, cached tokens)."""
        engine.submit(req, now)
        events = SimKit.run_until_idle(engine)
        first = next(e for e in events if e[0] == "first_token" and e[1] == req.request_id)
        done = next(e for e in events if e[0] == "finished" and e[1] == req.request_id)
        return first[2] - now, done[2], done[3]
