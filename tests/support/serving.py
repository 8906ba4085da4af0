"""Real ``prefix-router serve`` processes for tests: started on a free port with their logs in a file,
waited for, and stopped (``serve_process`` fixture in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from support.net import free_port


@dataclass
class ServeProcess:
    """A real ``prefix-router serve`` process; its stderr (the logs) goes to ``log`` (a file)."""

    process: asyncio.subprocess.Process
    url: str
    log: Path

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def lines(self, marker: str) -> list[str]:
        return [line for line in self.logs().splitlines() if marker in line]

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    async def stop(self) -> bytes:
        """SIGTERM, wait, and return what it wrote to stderr (its log)."""
        if self.process.returncode is None:
            self.process.terminate()
        await asyncio.wait_for(self.process.wait(), 30)
        return self.log.read_bytes()


ServeFactory = Callable[..., Awaitable[ServeProcess]]


class ServeProcesses:
    """``await spawn("--worker", url, ..., env={...}, ready=True)``: ``python -m prefix_router.proxy serve
    ARGS --port FREE`` (``ready``: waits for ``/ready`` 200, else ``/health``), one serving process unless
    ARGS say ``--processes``; ``close`` kills what is still running."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.procs: list[ServeProcess] = []

    async def spawn(self, *args: str, env: dict[str, str] | None = None, ready: bool = True) -> ServeProcess:
        port = free_port()
        log = self.directory / f"serve-{len(self.procs)}.log"
        # one serving process unless asked (the default, one per core: tests/proxy/run/test_processes.py)
        single = () if "--processes" in args else ("--processes", "1")
        argv = ["-m", "prefix_router.proxy", "serve", *args, *single, "--port", str(port)]
        with log.open("wb") as sink:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, *argv, stderr=sink, env={**os.environ, **(env or {})}
            )
        self.procs.append(ServeProcess(proc, f"http://127.0.0.1:{port}", log))
        await wait_serving(self.procs[-1], "/ready" if ready else "/health")
        return self.procs[-1]

    async def close(self) -> None:
        for served in self.procs:
            if served.process.returncode is None:
                served.process.kill()
            await served.process.wait()


async def wait_serving(served: ServeProcess, path: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if served.process.returncode is not None:
                raise AssertionError(f"serve exited with {served.process.returncode}: {served.logs()}")
            try:
                async with http.get(served.url + path) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{served.url} did not answer {path} in time: {served.logs()}")
