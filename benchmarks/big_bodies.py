"""How long one giant request stalls everybody else: small chat requests, one at a time, while giant bodies
(a million token ids, about 7 MB) keep arriving, through two router processes side by side: the default
(large bodies parsed in a worker thread, ``limits.parse_in_thread_bytes``) and parsing on the event loop.

    python benchmarks/big_bodies.py

The worker answers at once (``prefix_router.lab.bench.instant_worker``; it refuses bodies over 1 MiB with 413,
which does not matter here: the router has parsed and hashed them by then).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import aiohttp
import orjson
from rich.console import Console
from rich.table import Table

from prefix_router.lab.launch.net import free_port

SMALL = {"model": "instant", "messages": [{"role": "user", "content": "hi"}]}
VARIANTS = {"thread (default)": [], "event loop": ["--set", f"limits.parse_in_thread_bytes={10**12}"]}


@contextmanager
def processes(argvs: list[list[str]]) -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, *argv]) for argv in argvs]
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()


async def ready(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(150):
        with suppress(aiohttp.ClientError):
            async with http.get(url + "/ready") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not start")


async def smalls(http: aiohttp.ClientSession, url: str, n: int) -> list[float]:
    latencies = []
    for _ in range(n):
        began = time.perf_counter()
        async with http.post(url + "/v1/chat/completions", json=SMALL) as resp:
            await resp.read()
        latencies.append(time.perf_counter() - began)
        await asyncio.sleep(0.01)
    return sorted(latencies)


async def giants(http: aiohttp.ClientSession, url: str, body: bytes, stop: asyncio.Event) -> int:
    sent = 0
    while not stop.is_set():
        async with http.post(
            url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            await r.read()
        sent += 1
    return sent


async def measure(url: str, body: bytes, n: int) -> tuple[list[float], int]:
    async with aiohttp.ClientSession() as http:
        await ready(http, url)
        stop = asyncio.Event()
        flood = asyncio.ensure_future(giants(http, url, body, stop))
        latencies = await smalls(http, url, n)
        stop.set()
        return latencies, await flood


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=1_000_000, help="token ids per giant body")
    parser.add_argument("--small", type=int, default=200, help="small requests measured per router")
    args = parser.parse_args()
    body = orjson.dumps({"model": "instant", "prompt": list(range(args.tokens))})
    worker = free_port()
    ports = {name: free_port() for name in VARIANTS}
    argvs = [["-m", "prefix_router.lab.bench.instant_worker", "--port", str(worker)]]
    for name, extra in VARIANTS.items():
        base = ["-m", "prefix_router.proxy", "serve", "--worker", f"http://127.0.0.1:{worker}"]
        quiet = ["--set", "log_level=warning", "--set", "access_log=false"]
        argvs.append([*base, "--port", str(ports[name]), *quiet, *extra])
    table = Table(
        title=f"small-request latency while {len(body) / 2**20:.1f} MiB bodies arrive (one router each)"
    )
    for column in ("parsing", "p50 ms", "p99 ms", "max ms", "giant bodies parsed"):
        table.add_column(column, justify="right")
    with processes(argvs):
        for name, port in ports.items():
            lat, giant = asyncio.run(measure(f"http://127.0.0.1:{port}", body, args.small))
            row = [lat[len(lat) // 2], lat[int(len(lat) * 0.99)], lat[-1]]
            table.add_row(name, *(f"{v * 1e3:.1f}" for v in row), str(giant))
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
