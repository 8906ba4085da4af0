"""Several router replicas in front of the same simulated engines (SIMULATED figures).

Requests are spread across the replicas at random (what an L4 load balancer or a Kubernetes Service
does). Modes, all over the same requests and engines (``prefix_router.lab.sim``'s cluster simulator):

- ``single``: one router sees everything (the target);
- ``independent``: N replicas, each with only its own view (no shared state);
- ``shared-index``: N replicas sharing index changes through a real redis-server
  (``prefix_router.replication``);
- ``shared``: the same plus shared in-flight counts (``sync_load`` every ``load_interval_s`` of simulated
  time, as the background task does every 0.5 s by default);
- ``local``: N processes of one ``serve --processes N`` sharing index changes and in-flight counts over
  the local channel (``replication.local``, real Unix datagram sockets; load every ``load_interval_s``).

Propagation: replicas publish and read the stream at sync points every ``--sync-interval-s`` of simulated
time (0: before every arrival). Through loopback Redis a change reaches the other replicas in about a
millisecond of real time (measured by ``--propagation``), far below the gaps between arrivals, so 0 is
realistic; larger intervals show how much staleness costs.

    python benchmarks/multi_replica.py --trace ../shared/traces/mooncake_conversation_trace.jsonl \
        --instances 16 --replicas 4

The engines, the times and the hit rates are simulated; the Redis traffic is real.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from prefix_router.lab.sim.engine import EngineEvent
from prefix_router.lab.sim.profiles import DEFAULT_PROFILE, get_profile
from prefix_router.lab.sim.requests import RequestSource, SimRequest
from prefix_router.lab.sim.run import Scenario, trace_scenario, workload_scenario
from prefix_router.lab.sim.simulator import ClusterSimulation, ClusterSpec
from prefix_router.lab.sim.stats import details, summarize
from prefix_router.replication import LocalReplication, RedisReplication, ReplicationSettings, make_client
from prefix_router.routing import IndexChange, Router, RouteRequest, RoutingSettings

MODES = ("single", "independent", "shared-index", "shared", "local")


# ---------------------------------------------------------------------------------------- redis-server


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A throw-away redis-server on a free loopback port (no persistence); yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (Debian package redis-server)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as workdir:
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = subprocess.Popen([*args, "--dir", workdir], stdout=subprocess.DEVNULL)
        try:
            _wait_port(port)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.kill()
            proc.wait()


def _wait_port(port: int) -> None:
    for _ in range(500):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.01)
    raise RuntimeError("redis-server did not start")


# ---------------------------------------------------------------------------------------- shared state


class RedisSync:
    """The replicas' RedisStates, driven at sync points in simulated time (no background tasks)."""

    def __init__(
        self, url: str, key: str, interval_s: float, share_load: bool, load_interval_s: float
    ) -> None:
        self.url, self.key = url, key
        self.interval_s, self.share_load, self.load_interval_s = interval_s, share_load, load_interval_s
        self.loop = asyncio.new_event_loop()
        self.states: list[RedisReplication] = []
        self.now = 0.0
        self._last = self._last_load = -1e18
        self.sync_seconds = 0.0
        self.syncs = 0

    def attach(self, routers: list[Router]) -> None:
        cfg = ReplicationSettings(key_prefix=self.key, stream_maxlen=200_000)
        for i, router in enumerate(routers):
            client, reader = make_client(self.url, cfg, 5.0, 2), make_client(self.url, cfg, 5.0, 1)
            state = RedisReplication(router, client, reader, f"replica-{i}", cfg, clock=lambda: self.now)
            self.loop.run_until_complete(state.start(run_tasks=False))
            self.states.append(state)

    def before_arrival(self, now: float) -> None:
        self.now = now
        if now - self._last >= self.interval_s:
            started = time.perf_counter()
            self.loop.run_until_complete(self._sync(now))
            self.sync_seconds += time.perf_counter() - started
            self.syncs += 1
            self._last = now

    async def _sync(self, now: float) -> None:
        for state in self.states:
            await state.flush()
        for state in self.states:
            while await state.read_once():
                pass
        if self.share_load and now - self._last_load >= self.load_interval_s:
            for state in self.states:
                await state.sync_load()
            self._last_load = now

    def totals(self) -> dict[str, float]:
        keys = ("published_changes", "published_entries", "applied_changes", "failures")
        return {k: sum(s.stats()[k] for s in self.states) for k in keys}

    def close(self) -> None:
        for state in self.states:
            self.loop.run_until_complete(state.stop())
        self.loop.close()


class LocalSync:
    """The replicas' LocalStates (``serve --processes``), driven at sync points in simulated time."""

    def __init__(self, interval_s: float, load_interval_s: float) -> None:
        self.interval_s, self.load_interval_s = interval_s, load_interval_s
        self.directory = Path(tempfile.mkdtemp(prefix="pr-bench-"))
        self.loop = asyncio.new_event_loop()
        self.states: list[LocalReplication] = []
        self.now = 0.0
        self._last = self._last_load = -1e18
        self.sync_seconds = 0.0
        self.syncs = 0

    def attach(self, routers: list[Router]) -> None:
        for i, router in enumerate(routers):
            state = LocalReplication(router, self.directory, i, len(routers), clock=lambda: self.now)
            self.loop.run_until_complete(state.start(run_tasks=False))
            self.states.append(state)

    def before_arrival(self, now: float) -> None:
        self.now = now
        if now - self._last < self.interval_s:
            return
        started = time.perf_counter()
        for state in self.states:
            state.flush()
        for state in self.states:
            state.read_once()
        if now - self._last_load >= self.load_interval_s:
            for state in self.states:
                state.sync_load()
            for state in self.states:
                state.read_once()
            self._last_load = now
        self.sync_seconds += time.perf_counter() - started
        self.syncs += 1
        self._last = now

    def totals(self) -> dict[str, float]:
        keys = ("published_changes", "published_entries", "applied_changes", "failures")
        return {k: sum(s.stats()[k] for s in self.states) for k in keys}

    def close(self) -> None:
        for state in self.states:
            self.loop.run_until_complete(state.stop())
        self.loop.close()
        shutil.rmtree(self.directory, ignore_errors=True)


# ---------------------------------------------------------------------------------------- simulation


class ReplicatedSimulation(ClusterSimulation):
    """``ClusterSimulation`` with N routers; each request is routed by a replica picked at random, and
    that replica sees its first token and its end (as the proxy replica holding the connection would)."""

    def __init__(
        self,
        spec: ClusterSpec,
        policy: str,
        source: RequestSource,
        routing: RoutingSettings,
        replicas: int,
        sync: RedisSync | LocalSync | None,
    ) -> None:
        super().__init__(spec, policy, source, routing)
        self.routers = [self.router] + [self._replica(routing, i) for i in range(1, replicas)]
        self.pick = random.Random(f"replica-pick:{spec.seed}")
        self.owner: dict[str, Router] = {}  # live requests only
        self.sync = sync
        if sync is not None:
            sync.attach(self.routers)

    def _replica(self, routing: RoutingSettings, i: int) -> Router:
        router = self._router(routing)
        router.rng = random.Random(f"router:{self.spec.seed}:{i}")
        return router

    @contextlib.contextmanager
    def _using(self, router: Router) -> Iterator[None]:
        previous, self.router = self.router, router
        try:
            yield
        finally:
            self.router = previous

    def on_arrival(self, request: SimRequest, now: float) -> None:
        if self.sync is not None:
            self.sync.before_arrival(now)
        router = self.pick.choice(self.routers)
        self.owner[request.request_id] = router
        with self._using(router):
            super().on_arrival(request, now)
        if request.request_id not in self._live:
            self.owner.pop(request.request_id, None)

    def _on_first_token(self, event: EngineEvent) -> None:
        with self._using(self.owner[event.request_id]):
            super()._on_first_token(event)

    def _on_finished(self, event: EngineEvent) -> None:
        with self._using(self.owner.pop(event.request_id)):
            super()._on_finished(event)

    def on_scrape(self, now: float) -> None:
        for router in self.routers:
            for name, engine in zip(self.names, self.engines, strict=True):
                router.set_engine_load(name, engine.num_waiting, engine.kv_usage, now)
        if self._live or self._upcoming is not None:
            from prefix_router.lab.sim.events import MetricsScrape

            self.queue.push(now + self.spec.scrape_interval_s, MetricsScrape())


def run_mode(scenario: Scenario, mode: str, args: argparse.Namespace, url: str | None) -> dict[str, Any]:
    replicas = 1 if mode == "single" else args.replicas
    sync: RedisSync | LocalSync | None = None
    if mode == "local":
        sync = LocalSync(args.sync_interval_s, args.load_interval_s)
    elif mode.startswith("shared"):
        assert url is not None
        key = f"bench:{mode}:{args.sync_interval_s}:{time.time_ns()}"
        sync = RedisSync(url, key, args.sync_interval_s, mode == "shared", args.load_interval_s)
    source = scenario.make_source()
    sim = ReplicatedSimulation(scenario.spec, "prefix", source, scenario.routing("prefix"), replicas, sync)
    try:
        result = sim.run()
    finally:
        if sync is not None:
            sync.close()
    row = {"mode": mode, "replicas": replicas, **summarize(result.stats)}
    row["details"] = details(result.stats, result.wall_s)
    if sync is not None:
        row["redis" if isinstance(sync, RedisSync) else "local"] = {
            **sync.totals(),
            "syncs": sync.syncs,
            "sync_wall_s": sync.sync_seconds,
        }
    return row


# ---------------------------------------------------------------------------------------- propagation


async def propagation(url: str, changes: int, rate: float) -> dict[str, float]:
    """Real publish-to-apply latency between two replicas with their background tasks (loopback Redis)."""
    routers = [Router(RoutingSettings()) for _ in range(2)]
    for router in routers:
        router.add_worker("w")
    cfg = ReplicationSettings(key_prefix=f"bench:propagation:{time.time_ns()}")
    states = [RedisReplication(r, make_client(url, cfg, 2.0, 4), make_client(url, cfg, 3.0, 1), f"p{i}", cfg)
              for i, r in enumerate(routers)]  # fmt: skip
    sent: dict[int, float] = {}
    latencies: list[float] = []
    receiver = routers[1]
    original = receiver.apply

    def timed_apply(change: IndexChange) -> None:
        latencies.append(time.perf_counter() - sent[change.blocks[0]])
        original(change)

    receiver.apply = timed_apply  # type: ignore[method-assign]
    for state in states:
        await state.start()
    for i in range(changes):
        sent[i] = time.perf_counter()
        req = RouteRequest(f"p{i}", (i,), 16, 16, hash_key=i)
        routers[0].dispatched(req, routers[0].route(req, ["w"], time.monotonic()), time.monotonic())
        await asyncio.sleep(1.0 / rate)
    deadline = time.monotonic() + 5
    while len(latencies) < changes and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    for state in states:
        await state.stop()
    ms = sorted(x * 1000 for x in latencies)
    return {"changes": changes, "received": len(ms), "rate_per_s": rate, "p50_ms": statistics.median(ms),
            "p99_ms": ms[int(0.99 * (len(ms) - 1))], "max_ms": ms[-1]}  # fmt: skip


# ---------------------------------------------------------------------------------------- report


def table(rows: list[dict[str, Any]], title: str) -> Table:
    single = next(r for r in rows if r["mode"] == "single")
    out = Table(title=title)
    for col in (
        "mode",
        "replicas",
        "hit rate",
        "x single",
        "TTFT p50 / p90 / p99 ms",
        "e2e p50 ms",
        "imbalance",
    ):
        out.add_column(col)
    for r in rows:
        t = r["ttft_ms"]
        out.add_row(
            r["mode"], str(r["replicas"]), f"{100 * r['hit_rate']:.1f} %",
            f"{r['hit_rate'] / single['hit_rate']:.3f}" if single["hit_rate"] else "-",
            f"{t['p50']:,.0f} / {t['p90']:,.0f} / {t['p99']:,.0f}", f"{r['e2e_ms']['p50']:,.0f}",
            f"{r['load_imbalance']:.2f}",
        )  # fmt: skip
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    single = next(r for r in rows if r["mode"] == "single")["hit_rate"]
    lines = [
        "| mode | replicas | hit rate | x single | TTFT p50 / p90 / p99 ms | e2e p50 ms | imbalance |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["ttft_ms"]
        lines.append(
            f"| {r['mode']} | {r['replicas']} | {100 * r['hit_rate']:.1f} % | {r['hit_rate'] / single:.3f} | "
            f"{t['p50']:,.0f} / {t['p90']:,.0f} / {t['p99']:,.0f} | {r['e2e_ms']['p50']:,.0f} | "
            f"{r['load_imbalance']:.2f} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- main


def build_scenario(args: argparse.Namespace) -> Scenario:
    profile = get_profile(args.profile)
    if args.trace:
        spec = ClusterSpec(args.instances, profile, args.kv_capacity_tokens or 1_000_000, args.seed)
        return trace_scenario(args.trace, spec, args.rate_scale, args.limit)
    capacity = args.kv_capacity_tokens or profile.kv_capacity_tokens
    spec = ClusterSpec(args.instances, profile, capacity, args.seed)
    options = dict(item.split("=", 1) for item in args.workload_opt)
    return workload_scenario(args.workload, spec, args.rate_scale, args.limit, options)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="Mooncake-format trace")
    source.add_argument("--workload", help="a benchmark workload name (prefix_router.lab.workloads)")
    p.add_argument("--workload-opt", action="append", default=[], metavar="K=V")
    p.add_argument("--instances", type=int, default=16)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--profile", default=DEFAULT_PROFILE)
    p.add_argument("--kv-capacity-tokens", type=int, default=None)
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sync-interval-s", type=float, default=0.0, help="simulated seconds between syncs")
    p.add_argument("--load-interval-s", type=float, default=0.5, help="simulated seconds between load syncs")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--propagation", type=int, default=2000, help="changes for the latency test (0: skip)")
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    console = Console(width=150)
    scenario = build_scenario(args)
    rows: list[dict[str, Any]] = []
    with redis_server() as url:
        for mode in args.modes.split(","):
            started = time.perf_counter()
            console.print(f"[dim]running {mode} ...[/dim]")
            rows.append(run_mode(scenario, mode, args, url))
            console.print(f"[dim]{mode}: {time.perf_counter() - started:.1f} s wall[/dim]")
        prop = asyncio.run(propagation(url, args.propagation, 1000.0)) if args.propagation else None
    title = (f"SIMULATED: {scenario.label}, {args.instances} x {args.profile}, {args.replicas} replicas, "
             f"sync every {args.sync_interval_s:g} s")  # fmt: skip
    console.print(table(rows, title))
    console.print(markdown(rows))
    if prop is not None:
        console.print(f"propagation through loopback Redis (real): {json.dumps(prop)}")
    for r in rows:
        for channel in ("redis", "local"):
            if channel in r:
                console.print(f"{r['mode']} {channel} traffic (real): {json.dumps(r[channel])}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"simulated": True, "rows": rows, "propagation": prop}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
