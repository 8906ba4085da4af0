"""``serve --processes``: admin changes reach every process, in any order, after restarts; only process 0
probes and scrapes, and the others take its results as their own."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import orjson
import pytest

from prefix_router.node.config import load_config
from prefix_router.node.control import shared_pool
from prefix_router.node.control.shared_pool import SharedPool
from prefix_router.node.life.build import build_state
from prefix_router.node.state import AdminChange, NodeState
from prefix_router.pool.http import Fetched, FetchError
from prefix_router.pool.settings import WorkerSettings
from prefix_router.replication.local import LocalReplication

VLLM_METRICS = "vllm:num_requests_waiting 7\nvllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.5\n"


class ScriptedFetcher:
    """Every engine answers health, models and metrics; ``down`` ones refuse; calls are counted."""

    def __init__(self, down: set[str]) -> None:
        self.down = down
        self.calls: list[str] = []

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float, max_bytes: int) -> Fetched:
        self.calls.append(url)
        if any(url.startswith(d) for d in self.down):
            raise FetchError("connection refused")
        if url.endswith("/v1/models"):
            return Fetched(200, orjson.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}))
        if url.endswith("/metrics"):
            return Fetched(200, VLLM_METRICS.encode())
        return Fetched(200, b"{}")


class Process:
    def __init__(
        self, index: int, directory: Path, fetcher: ScriptedFetcher, wall: Callable[[], int]
    ) -> None:
        settings = {
            "workers": [{"url": "http://a:1", "name": "a"}],
            "health.fail_threshold": 2,
            "health.interval_s": 0.05,
            "scrape.interval_s": 0.05,
        }
        config = load_config(env={}, overrides=settings)
        self.fetcher = fetcher
        self.state: NodeState = build_state(config, None, fetcher, time.monotonic, random.Random(index))
        self.channel = LocalReplication(self.state.router, directory, index, 3)
        self.shared = SharedPool(self.state, self.channel, index, wall)
        self.shared.install()

    async def start(self) -> None:
        await self.channel.start(run_tasks=False)

    def worker_names(self) -> list[str]:
        return [w.name for w in self.state.pool]


class Group:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.down: set[str] = set()
        self.ns = 0
        self.procs: dict[int, Process] = {}

    def wall(self) -> int:
        self.ns += 1
        return self.ns

    async def start(self, index: int) -> Process:
        proc = Process(index, self.directory, ScriptedFetcher(self.down), self.wall)
        await proc.start()
        self.procs[index] = proc
        return proc

    def deliver(self) -> None:
        """What every process has to say, read by every other (its relay flushed, full queues retried)."""
        for proc in self.procs.values():
            proc.shared.flush_relay()
        for _ in range(50):
            for proc in self.procs.values():
                proc.channel.resend()
            for proc in self.procs.values():
                proc.channel.read_once()
            if not any(peer.backlog for proc in self.procs.values() for peer in proc.channel.peers.values()):
                return

    async def stop(self, index: int) -> None:
        await self.procs.pop(index).channel.stop()


@pytest.fixture
async def group() -> AsyncIterator[Group]:
    directory = Path(tempfile.mkdtemp(prefix="sp-", dir="/tmp"))  # Unix socket paths must be short
    grp = Group(directory)
    try:
        yield grp
    finally:
        for index in list(grp.procs):
            await grp.stop(index)
        shutil.rmtree(directory, ignore_errors=True)


def admin_add(proc: Process, name: str, url: str) -> None:
    cfg = WorkerSettings(url=url, name=name, api_key="sk-secret-key")  # type: ignore[arg-type]
    proc.state.pool.add(cfg)
    proc.state.on_admin(AdminChange("add", name, cfg))  # type: ignore[misc]


async def test_admin_changes_reach_every_process_and_a_restarted_one_catches_up(group: Group) -> None:
    zero, one, two = [await group.start(i) for i in range(3)]
    admin_add(one, "b", "http://b:1")
    group.deliver()
    assert zero.worker_names() == two.worker_names() == ["a", "b"]
    assert zero.state.pool.require("b").api_key.get_secret_value() == "sk-secret-key"  # type: ignore[union-attr]
    two.state.pool.drain("a")
    two.state.on_admin(AdminChange("drain", "a"))  # type: ignore[misc]
    zero.state.pool.remove("b")
    zero.state.on_admin(AdminChange("remove", "b"))  # type: ignore[misc]
    group.deliver()
    for proc in (zero, one, two):
        assert proc.worker_names() == ["a"] and proc.state.pool.require("a").draining
    await group.stop(1)
    fresh = await group.start(1)  # restarted: the configured workers only
    assert fresh.worker_names() == ["a"] and not fresh.state.pool.require("a").draining
    zero.shared.publish()
    group.deliver()
    assert fresh.state.pool.require("a").draining


async def test_older_news_never_undoes_newer_and_repeats_are_harmless(group: Group) -> None:
    zero, one = [await group.start(i) for i in range(2)]
    admin_add(zero, "b", "http://b:1")
    stale = orjson.dumps([zero.shared.registers["b"].wire("b")])
    group.deliver()
    one.state.pool.remove("b")
    one.state.on_admin(AdminChange("remove", "b"))  # type: ignore[misc]
    group.deliver()
    zero.shared._on_admin(stale)  # the add again, late: older than the removal
    one.shared._on_admin(stale)
    zero.shared.publish()
    one.shared.publish()
    group.deliver()
    assert zero.worker_names() == one.worker_names() == ["a"]


async def test_only_process_zero_probes_and_the_others_take_its_verdicts(group: Group) -> None:
    zero, one = [await group.start(i) for i in range(2)]
    for proc in (zero, one):
        proc.state.monitor.start()
    await asyncio.sleep(0.5)  # ten rounds of probes and scrapes, had they run
    for proc in (zero, one):
        await proc.state.monitor.stop()
    assert any(call.endswith("/health") for call in zero.fetcher.calls)
    assert not any(call.endswith(("/health", "/metrics")) for call in one.fetcher.calls)
    group.down.add("http://a:1")
    for _ in range(2):  # health.fail_threshold
        await zero.state.monitor.prober.probe_all()
        group.deliver()
    assert not zero.state.pool.require("a").health.healthy
    assert not one.state.pool.require("a").health.healthy  # ejected without probing
    assert one.state.pool.require("a").health.last_error is not None


async def test_process_zeros_scrapes_feed_every_routing_core(group: Group) -> None:
    zero, one = [await group.start(i) for i in range(2)]
    worker = zero.state.pool.require("a")
    await zero.state.monitor.identifier.identify(worker)  # learns it is a vLLM engine
    await zero.state.monitor.scraper.scrape(worker)
    group.deliver()
    now = time.monotonic()
    assert one.state.router.load.snapshot("a", now).queue_depth == 7
    assert one.state.router.load.snapshot("a", now).kv_usage == 0.5


async def test_registers_are_bounded(group: Group, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_pool, "MAX_NAMES", 5)
    zero, one = [await group.start(i) for i in range(2)]
    for i in range(12):
        zero.state.on_admin(AdminChange("drain", f"w{i}"))  # type: ignore[misc]
    group.deliver()
    assert len(zero.shared.registers) == 5 and len(one.shared.registers) == 5
    assert set(zero.shared.registers) == {f"w{i}" for i in range(7, 12)}  # the newest stay


async def test_a_session_signed_out_in_one_process_is_revoked_in_every_one(group: Group) -> None:
    zero, one, two = [await group.start(i) for i in range(3)]
    expiry = int(time.time()) + 3600
    one.state.revoked.revoke("s-copied", expiry)  # the logout reached process 1
    group.deliver()
    assert all("s-copied" in p.state.revoked for p in (zero, one, two))
    await group.stop(2)
    restarted = await group.start(2)  # a fresh process knows nothing ...
    assert "s-copied" not in restarted.state.revoked
    zero.shared.publish()  # ... until the next round of publishes
    group.deliver()
    assert "s-copied" in restarted.state.revoked


async def test_a_role_changed_in_one_process_reaches_the_others_newest_first(group: Group) -> None:
    zero, one, two = [await group.start(i) for i in range(3)]
    one.state.pool.set_role("a", "prefill")
    one.state.on_admin(AdminChange("role", "a", role="prefill"))  # type: ignore[misc]
    stale = orjson.dumps([one.shared.registers["a"].wire("a")])
    group.deliver()
    assert all(
        p.state.pool.require("a").role == "prefill" and p.state.pool.disaggregated for p in (zero, two)
    )
    two.state.pool.set_role("a", "decode")
    two.state.on_admin(AdminChange("role", "a", role="decode"))  # type: ignore[misc]
    group.deliver()
    zero.shared._on_admin(stale)  # the older change, late: ignored
    assert [p.state.pool.require("a").role for p in (zero, one, two)] == ["decode"] * 3
    assert not zero.state.pool.disaggregated
    await group.stop(1)
    fresh = await group.start(1)  # restarted: the configured role, then the register
    assert fresh.state.pool.require("a").role == "both"
    zero.shared.publish()
    group.deliver()
    assert fresh.state.pool.require("a").role == "decode"
