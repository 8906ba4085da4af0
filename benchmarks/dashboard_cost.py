"""What the dashboard costs the request path: the same requests through the same router with no dashboard
(its decision feed replaced by one that records nothing), with the dashboard unwatched (the default: the
feed records every decision, nothing else runs) and watched (``--viewers`` pages polling
``/dashboard/data`` every second, as the page does: the document is made in the router's loop).

One process serves the router and sends the requests (``--concurrency`` in flight, ``--requests`` a
round); the engine is the instant worker (``lab/bench/instant_worker.py``, its own process: it answers at
once, so the time measured is the router's and the client's). Rounds rotate the three variants; each
cell is the median over ``--rounds``: requests per second, latency p50/p99 and the process's CPU time per
request, with each variant's ratio to no dashboard. Then the document itself: the time to make one for a
64-worker fleet with a full feed (what a watched router spends per second per viewer, at most: viewers
within ``FRESH_S`` share one).

    python benchmarks/dashboard_cost.py --requests 3000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import time

import aiohttp

from prefix_router.lab.launch.net import free_port
from prefix_router.node import STATE, DecisionEntry, DecisionFeed, dashboard, load_config
from prefix_router.proxy import create_app, start
from prefix_router.routing import Decision, RouteRequest

TOKEN = "bench-admin-token"
VARIANTS = ("no dashboard", "unwatched", "watched")
FRESH_S = 0.5  # node/control/dashboard/board.py: a document is shared by the viewers that ask within this


class NoFeed(DecisionFeed):
    """A decision feed that records nothing: the node without the dashboard's cost."""

    def add(self, at: float, policy: str, decision: Decision, req: RouteRequest) -> DecisionEntry:
        return None  # type: ignore[return-value]  # the request path takes None: no entry

    def reported(self, route_id: str, cached: int | None, prompt: int | None) -> None:
        return None


async def one_round(worker: str, variant: str, args: argparse.Namespace) -> dict[str, float]:
    overrides = {"workers": [{"url": worker, "name": "instant"}], "auth.admin_token": TOKEN,
                 "access_log": False, "log_level": "warning"}  # fmt: skip
    app = create_app(load_config(env={}, overrides=overrides))
    if variant == "no dashboard":
        app[STATE].decisions = NoFeed()
    running = await start(app, shutdown_timeout=0.2)
    viewers: list[asyncio.Task[None]] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency)) as http:
            await ready(http, running.url)
            await send(http, running.url, 50, args)  # warm-up
            if variant == "watched":
                viewers = [asyncio.create_task(watch(http, running.url)) for _ in range(args.viewers)]
            cpu, wall = time.process_time(), time.perf_counter()
            latencies = await send(http, running.url, args.requests, args)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        for task in viewers:
            task.cancel()
        await asyncio.gather(*viewers, return_exceptions=True)
        await running.stop()
    latencies.sort()
    return {
        "rps": args.requests / wall,
        "p50_ms": 1e3 * latencies[len(latencies) // 2],
        "p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)],
        "cpu_us": 1e6 * cpu / args.requests,
    }


async def ready(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(100):
        async with http.get(url + "/ready") as resp:
            if resp.status == 200:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError("the router never became ready")


async def send(http: aiohttp.ClientSession, url: str, n: int, args: argparse.Namespace) -> list[float]:
    system = "You are a helpful assistant of a shop. " * (args.prompt_chars // 40)
    latencies: list[float] = []
    todo = iter(range(n))

    async def client() -> None:
        for i in todo:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": f"q {i}"}]
            body = {"model": "instant", "max_tokens": 8, "messages": messages}
            began = time.perf_counter()
            async with http.post(url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            latencies.append(time.perf_counter() - began)

    await asyncio.gather(*(client() for _ in range(args.concurrency)))
    return latencies


async def watch(http: aiohttp.ClientSession, url: str) -> None:
    while True:
        async with http.get(url + "/dashboard/data", headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            await resp.read()
        await asyncio.sleep(1.0)


def feed_us(n: int = 100_000) -> float:
    """Microseconds the request path spends on the feed per request: an entry made and appended, the
    engine's report and the outcome filled in (``choose``, ``settle``, ``request_closed``)."""
    from prefix_router.node import closed_decision
    from prefix_router.routing import Router, RoutingSettings

    feed, router = DecisionFeed(), Router(RoutingSettings())
    router.add_worker("a")
    reqs = [RouteRequest(f"r{i}", tuple(range(100)), 16, 1600, hash_key=1) for i in range(4096)]
    decision = router.route(reqs[0], ["a"], 0.0)
    began = time.perf_counter()
    for i in range(n):
        req = reqs[i % 4096]
        entry = feed.add(1.0, "prefix", decision, req)
        feed.reported(req.route_id, 1, 2)
        closed_decision(entry, 0.1, 200)
    return 1e6 * (time.perf_counter() - began) / n


def document_ms(workers: int = 64) -> float:
    """Milliseconds to make one document: ``workers`` workers, a full feed over thousands of prefixes."""
    entries = [{"url": f"http://10.0.0.{i}:8000", "name": f"gpu-{i}"} for i in range(workers)]
    app = create_app(load_config(env={}, overrides={"workers": entries, "auth.admin_token": TOKEN}))
    state = app[STATE]
    now = state.clock()
    rng = random.Random(0)
    for i in range(5000):
        tag = rng.randrange(3000)
        blocks = tuple(range(tag * 100, tag * 100 + 32))
        req = RouteRequest(f"r{i}", blocks, 16, 512, hash_key=blocks[0], namespace=1 + tag % 50)
        decision = state.router.route(req, [f"gpu-{i % workers}"], now)
        state.router.dispatched(req, decision, now)
        state.decisions.add(now, "prefix", decision, req)
    board = dashboard.Board(state)
    times = []
    for _ in range(20):
        began = time.perf_counter()
        board.document(now)
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="requests a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--viewers", type=int, default=2, help="pages watching in the watched variant")
    parser.add_argument("--prompt-chars", type=int, default=2000)
    args = parser.parse_args()
    port = free_port()
    worker = subprocess.Popen(
        [sys.executable, "-m", "prefix_router.lab.bench.instant_worker", "--port", str(port)],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.5)
        cells: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            for variant in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:  # rotated: no variant always first
                cells[variant].append(asyncio.run(one_round(f"http://127.0.0.1:{port}", variant, args)))
    finally:
        worker.terminate()
        worker.wait(10)
    report(cells, args)
    cpu = statistics.median(c["cpu_us"] for c in cells["unwatched"])
    feed = feed_us()
    print(f"\nthe decision feed on the request path: {feed:.1f} us a request "
          f"({feed / cpu:.2%} of the CPU a request costs here, {cpu:.0f} us)")  # fmt: skip
    print(f"one dashboard document, 64 workers, a full feed (2048 decisions over ~1,600 prefixes): "
          f"{document_ms():.1f} ms (made at most once per {FRESH_S} s, shared by the viewers)")  # fmt: skip


def report(cells: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    medians = {v: {k: statistics.median(c[k] for c in cells[v]) for k in cells[v][0]} for v in VARIANTS}
    base = medians["no dashboard"]
    print(f"{args.requests} requests a round, {args.concurrency} in flight, {args.rounds} rounds (medians), "
          f"instant worker; watched: {args.viewers} pages polling every second")  # fmt: skip
    print(f"{'variant':<14}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'CPU us/req':>12}"
          f"{'req/s ratio':>13}{'p50 ratio':>11}{'CPU ratio':>11}")  # fmt: skip
    for v in VARIANTS:
        m = medians[v]
        print(f"{v:<14}{m['rps']:>9.0f}{m['p50_ms']:>9.2f}{m['p99_ms']:>9.2f}{m['cpu_us']:>12.0f}"
              f"{m['rps'] / base['rps']:>13.3f}{m['p50_ms'] / base['p50_ms']:>11.3f}"
              f"{m['cpu_us'] / base['cpu_us']:>11.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
