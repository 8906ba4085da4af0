"""What gzip bombs do to everybody else: ``/health`` latency and the router's memory and CPU, first quiet,
then while bombs keep arriving (each 2 GiB of zeros gzipped to about 2 MB on the wire, over raw sockets,
``--senders`` at once), through one ``serve`` process; both phases in one run, side by side.

    python benchmarks/gzip_bombs.py [--seconds 10] [--senders 4]

The router's worker is a port nobody listens on: the bombs are refused (413) before any routing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from contextlib import suppress

import aiohttp
import psutil

from prefix_router.lab.bench.bombs import gzip_bomb
from prefix_router.lab.launch.net import free_port

DECODED_MIB = 2048


async def send_bombs(port: int, data: bytes, until: float, counts: dict[str, int]) -> None:
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Encoding: gzip\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode()
    while time.monotonic() < until:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head + data)
            with suppress(ConnectionError):
                await writer.drain()
            answer = await asyncio.wait_for(reader.read(200), 30)
            status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else "cut"
            counts[status] = counts.get(status, 0) + 1
        except (ConnectionError, TimeoutError):
            counts["cut"] = counts.get("cut", 0) + 1
        finally:
            writer.close()


async def watch(url: str, pid: int, until: float) -> dict[str, float]:
    """``/health`` every 20 ms (latencies) and the process's RSS, until ``until``."""
    process = psutil.Process(pid)
    latencies: list[float] = []
    rss: list[int] = []
    cpu_before = sum(process.cpu_times()[:2])
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < until:
            began = time.perf_counter()
            async with http.get(url + "/health") as resp:
                await resp.read()
            latencies.append(time.perf_counter() - began)
            rss.append(process.memory_info().rss)
            await asyncio.sleep(0.02)
    latencies.sort()
    return {
        "health p50 ms": statistics.median(latencies) * 1e3,
        "health p99 ms": latencies[int(len(latencies) * 0.99)] * 1e3,
        "health max ms": latencies[-1] * 1e3,
        "RSS peak MB": max(rss) / 2**20,
        "CPU s": sum(process.cpu_times()[:2]) - cpu_before,
    }


async def ready(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            with suppress(aiohttp.ClientError):
                async with http.get(url + "/health") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


async def measure(seconds: float, senders: int) -> None:
    data = gzip_bomb(DECODED_MIB)
    port = free_port()
    argv = ["-m", "prefix_router.proxy", "serve", "--worker", f"http://127.0.0.1:{free_port()}"]
    proc = subprocess.Popen([sys.executable, *argv, "--processes", "1", "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        await ready(url)
        quiet = await watch(url, proc.pid, time.monotonic() + seconds)
        counts: dict[str, int] = {}
        until = time.monotonic() + seconds
        bombing = [asyncio.create_task(send_bombs(port, data, until, counts)) for _ in range(senders)]
        loud = await watch(url, proc.pid, until)
        await asyncio.gather(*bombing)
    finally:
        proc.terminate()
        proc.wait()
    wire, decoded = len(data) / 2**20, DECODED_MIB / 1024
    print(f"bomb: {wire:.1f} MiB on the wire, {decoded:.0f} GiB decoded; {senders} senders")
    print(f"answers while bombing: {dict(sorted(counts.items()))}")
    print(f"{'':16}{'quiet':>10}{'bombs':>10}{'ratio':>8}")
    for key, value in quiet.items():
        ratio = loud[key] / value if value else float("inf")
        print(f"{key:16}{value:10.1f}{loud[key]:10.1f}{ratio:8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--senders", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(measure(args.seconds, args.senders))


if __name__ == "__main__":
    main()
