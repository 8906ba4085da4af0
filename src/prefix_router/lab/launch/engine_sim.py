"""Starting simulated engines for tests, benchmarks and the demo.

``start_engines(n, ...)``: a context manager running n ``engine-sim`` processes on free loopback ports
(each binds port 0 and prints its URL), waiting until every ``/health`` answers, yielding the base URLs
and terminating them (SIGTERM, then SIGKILL) on exit. ``running_engines(n, ...)``: the same in the
current asyncio loop, without processes (fast, for tests).
"""

from __future__ import annotations

import contextlib
import selectors
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass

from prefix_router.lab.launch.net import wait_until_ok
from prefix_router.lab.sim.profiles import DEFAULT_PROFILE
from prefix_router.lab.sim.server import READY_PREFIX, EngineSimSettings, running_server

MAX_ENGINES = 256


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Options shared by every launched engine (see ``prefix-router engine-sim --help``)."""

    profile: str = DEFAULT_PROFILE
    model: str | None = None
    kv_capacity_tokens: int | None = None
    time_scale: float = 1.0
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    host: str = "127.0.0.1"

    def argv(self) -> list[str]:
        args = ["--port", "0"]
        for key, value in asdict(self).items():
            if value is not None:
                args += [f"--{key.replace('_', '-')}", str(value)]
        return args


class EngineStartError(RuntimeError):
    """An engine process exited or did not become healthy in time."""


def _check_count(n: int) -> None:
    if not 1 <= n <= MAX_ENGINES:
        raise ValueError(f"between 1 and {MAX_ENGINES} engines, not {n}")


@contextlib.contextmanager
def start_engines(
    n: int, *, startup_timeout_s: float = 30.0, python: str = sys.executable, **options: object
) -> Iterator[list[str]]:
    """Run ``n`` engine processes; yields their base URLs (``http://127.0.0.1:PORT``)."""
    _check_count(n)
    opts = EngineSettings(**options)  # type: ignore[arg-type]
    command = [python, "-m", "prefix_router.lab.sim", *opts.argv()]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            processes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + startup_timeout_s
        urls = [_ready_url(p, deadline) for p in processes]
        for url in urls:
            if not wait_until_ok(f"{url}/health", deadline):
                raise EngineStartError(f"{url}/health did not answer in time")
        yield urls
    finally:
        for process in processes:
            stop_process(process)


def _ready_url(process: subprocess.Popen[bytes], deadline: float) -> str:
    """Read the engine's ready line (``ENGINE-SIM READY http://...``) from its stdout."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(max(0.0, deadline - time.monotonic())):
            raise EngineStartError("engine-sim did not start in time")
    line = process.stdout.readline().decode()
    if not line.startswith(READY_PREFIX):
        raise EngineStartError(f"engine-sim failed to start (exit code {process.poll()}): {line!r}")
    return line[len(READY_PREFIX) :].split()[0]


def stop_process(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()


@contextlib.asynccontextmanager
async def running_engines(n: int, **options: object) -> AsyncIterator[list[str]]:
    """Serve ``n`` engines in this event loop (no subprocesses); yields their base URLs."""
    _check_count(n)
    opts = EngineSettings(**options)  # type: ignore[arg-type]
    fields = {k: v for k, v in asdict(opts).items()}
    async with contextlib.AsyncExitStack() as stack:
        urls = [
            await stack.enter_async_context(running_server(EngineSimSettings(**fields))) for _ in range(n)
        ]
        yield urls
