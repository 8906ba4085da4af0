"""A real ``redis-server`` per test (on a free loopback port, no persistence), stopped by the fixture."""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from prefix_router.replication import RedisReplication, ReplicationSettings, attach
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Outcome, RouteRequest
from support import needs
from support.net import free_port
from support.waiting import wait_until

REDIS = shutil.which("redis-server")
WORKERS = ("w0", "w1", "w2", "w3")


class RedisProcess:
    """One redis-server on a fixed port that a test may kill, pause and restart."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary, self.workdir, self.port = binary, workdir, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        args += ["--dir", str(self.workdir), "--protected-mode", "yes", "--loglevel", "warning"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.01)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def pause(self, paused: bool) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    needs.require("redis")
    if REDIS is None:  # a failure, never a skip: `make test` installs it (make redis)
        pytest.fail("redis-server is not installed: run `make redis` (scripts/redis-server.sh ensure)")
    server = RedisProcess(REDIS, tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None:
            server.pause(False)
        server.kill()


def make_router(seed: int = 0, **knobs: object) -> Router:
    cfg = RoutingSettings.model_validate(
        {"keys": {"block_tokens": 16}, "index": {"worker_capacity_tokens": 16 * 10_000}, **knobs}
    )
    router = Router(cfg, random.Random(seed))
    for name in WORKERS:
        router.add_worker(name)
    return router


def fast_config(**changes: object) -> ReplicationSettings:
    base: dict[str, object] = dict(
        read_block_ms=50, load_interval_s=0.05, load_ttl_s=1.0, backoff_initial_s=0.02, backoff_max_s=0.2,
        op_timeout_s=0.5, connect_timeout_s=0.5, warmup_timeout_s=2.0,
    )  # fmt: skip
    base.update(changes)
    return ReplicationSettings(**base)  # type: ignore[arg-type]


class Replicas:
    """Routers attached to one Redis; all stopped at teardown."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.states: list[RedisReplication] = []

    async def add(
        self, seed: int = 0, cfg: ReplicationSettings | None = None, **kw: object
    ) -> RedisReplication:
        router = make_router(seed)
        state = await attach(router, self.url, f"r{len(self.states)}", cfg or fast_config(), **kw)  # type: ignore[arg-type]
        self.states.append(state)
        return state

    async def close(self) -> None:
        for state in self.states:
            await state.stop()


@pytest.fixture
async def replicas(redis_server: RedisProcess) -> AsyncIterator[Replicas]:
    group = Replicas(redis_server.url)
    try:
        yield group
    finally:
        await group.close()


class Kit:
    """Helpers for the tests (a fixture: test modules cannot import each other here)."""

    WORKERS = WORKERS
    make_router = staticmethod(make_router)
    fast_config = staticmethod(fast_config)

    @staticmethod
    def request(rid: str, blocks: tuple[int, ...]) -> RouteRequest:
        return RouteRequest(rid, blocks, 16, 16 * len(blocks) + 3, hash_key=blocks[0] if blocks else 0)

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
        req = Kit.request(rid, blocks)
        decision = router.route(req, candidates or list(WORKERS), now)
        router.dispatched(req, decision, now)
        if finish:
            router.finished(req, decision.worker, Outcome(), now)
        return decision.worker

    @staticmethod
    def prefix(tag: int, length: int = 4) -> tuple[int, ...]:
        return tuple(tag * 1000 + i for i in range(length))

    wait_until = staticmethod(wait_until)


@pytest.fixture
def kit() -> type[Kit]:
    return Kit
