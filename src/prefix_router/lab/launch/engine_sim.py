"""Starting simulated engines for tests, benchmarks and the demo.

``start_engines(n, ...)``: a context manager running n ``engine-sim`` processes on free loopback ports
(each binds port 0 and prints its URL), waiting until every ``/health`` answers, yielding the base URLs
and terminating them (SIGTERM, then SIGKILL) on exit. ``running_engines(n, ...)``: the same in the
current asyncio loop, without processes (fast, for tests). ``roles`` (one per engine: prefill, decode,
both) starts a disaggregated fleet: its engines share one KV store folder (``kv_store``, or a temporary
one removed on exit), for the shared-storage and SGLang bootstrap flows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

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
    role: str | None = None  # prefill | decode | both (None: both)
    kv_store: str | None = None

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
def engine_options(
    n: int, roles: Sequence[str] | None, options: dict[str, object]
) -> Iterator[list[EngineSettings]]:
    """Each engine's settings: ``options``, with its role and the fleet's KV store when ``roles`` given."""
    _check_count(n)
    opts = EngineSettings(**options)  # type: ignore[arg-type]
    if roles is None:
        yield [opts] * n
        return
    if len(roles) != n:
        raise ValueError(f"{len(roles)} roles for {n} engines")
    with contextlib.ExitStack() as stack:
        store = opts.kv_store or stack.enter_context(tempfile.TemporaryDirectory(prefix="prefix-router-kv-"))
        yield [dataclasses.replace(opts, role=role, kv_store=store) for role in roles]


@contextlib.contextmanager
def start_engines(
    n: int,
    *,
    startup_timeout_s: float = 30.0,
    python: str = sys.executable,
    roles: Sequence[str] | None = None,
    **options: object,
) -> Iterator[list[str]]:
    """Run ``n`` engine processes; yields their base URLs (``http://127.0.0.1:PORT``)."""
    with engine_options(n, roles, options) as each, _processes(each, startup_timeout_s, python) as urls:
        yield urls


@contextlib.contextmanager
def _processes(each: list[EngineSettings], startup_timeout_s: float, python: str) -> Iterator[list[str]]:
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for opts in each:
            command = [python, "-m", "prefix_router.lab.sim", *opts.argv()]
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
async def running_engines(
    n: int, *, roles: Sequence[str] | None = None, **options: object
) -> AsyncIterator[list[str]]:
    """Serve ``n`` engines in this event loop (no subprocesses); yields their base URLs."""
    with engine_options(n, roles, options) as each:
        async with contextlib.AsyncExitStack() as stack:
            urls = [await stack.enter_async_context(running_server(_server_settings(o))) for o in each]
            yield urls


def _server_settings(opts: EngineSettings) -> EngineSimSettings:
    fields: dict[str, Any] = {k: v for k, v in asdict(opts).items() if v is not None or k == "model"}
    return EngineSimSettings(**fields)
