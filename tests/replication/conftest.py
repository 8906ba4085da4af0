"""A real ``redis-server`` per test (on a free loopback port, no persistence), stopped by the fixture;
replicas attached to it, and the ``kit`` of helpers (``support.kits.ReplicationKit``)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from prefix_router.replication import RedisReplication, ReplicationSettings, attach
from support import needs
from support.kits import ReplicationKit
from support.net import free_port

REDIS = shutil.which("redis-server")


class RedisProcess:
    """One redis-server on a fixed port that a test may kill, pause and restart."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary, self.workdir, self.port = binary, workdir, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra: list[str] = []  # more redis-server arguments (``--requirepass``), for the next start

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
        args += ["--dir", str(self.workdir), "--protected-mode", "yes", "--loglevel", "warning", *self.extra]
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


class Replicas:
    """Routers attached to one Redis; all stopped at teardown."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.states: list[RedisReplication] = []

    async def add(
        self, seed: int = 0, cfg: ReplicationSettings | None = None, **kw: object
    ) -> RedisReplication:
        router, config = ReplicationKit.make_router(seed), cfg or ReplicationKit.fast_config()
        state = await attach(router, self.url, f"r{len(self.states)}", config, **kw)  # type: ignore[arg-type]
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


@pytest.fixture
def kit() -> type[ReplicationKit]:
    return ReplicationKit
