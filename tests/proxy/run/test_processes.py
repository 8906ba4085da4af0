"""``serve --processes N``: several processes on one port, one prefix view, one /metrics view, one stop."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefix_router.proxy.run import processes
from prefix_router.proxy.run.event_fanout import FanoutPlan
from prefix_router.proxy.run.processes import RestartBudget, _watch, process_count, usable_cores

PATH = "/v1/chat/completions"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "a shared prefix for every request " * 8}]}


def test_zero_processes_means_one_per_usable_core(tmp_path: Path) -> None:
    assert process_count(0) == usable_cores() == len(os.sched_getaffinity(0)) and process_count(3) == 3
    limit = tmp_path / "cpu.max"
    limit.write_text("150000 100000\n")  # a container limited to 1.5 CPUs
    assert usable_cores(limit) == min(2, len(os.sched_getaffinity(0)))
    limit.write_text("max 100000\n")
    assert usable_cores(limit) == len(os.sched_getaffinity(0))


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


async def served_by(url: str) -> int:
    """One request on a fresh connection (the kernel picks the process); returns its status."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http, http.post(url + PATH, json=CHAT) as resp:
        await resp.read()
        return resp.status


async def served_within(url: str, deadline: float) -> int:
    """``served_by``, tried until a process accepts the connection or ``deadline`` (monotonic) passes."""
    while True:
        try:
            return await served_by(url)
        except aiohttp.ClientConnectorError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> dict[Any, float]:
    async with http.get(url + "/metrics") as resp:
        return samples(await resp.text(), name)


@pytest.mark.timeout(120)
async def test_two_processes_share_the_port_the_view_and_metrics(
    fake_engine: Any, serve_process: Any
) -> None:
    engine = await fake_engine("a")
    served = await serve_process(
        "--worker", f"a={engine.url}", "--processes", "2", "--set", "log_level=warning",
        "--set", "scrape.interval_s=3600",
    )  # fmt: skip
    url = served.url
    statuses = [await served_by(url) for _ in range(20)]
    assert statuses == [200] * 20
    # Every process sends its counters once a second: scrape (each on a fresh connection, so whichever
    # process the kernel picks answers) until six in a row count all 20 requests and one of them shows
    # index changes that crossed between the processes; bounded, so a lost count fails.
    counted: list[float] = []
    applied: list[float] = []
    deadline = time.monotonic() + 30
    while len(counted) < 6 or not any(applied[-6:]):
        assert time.monotonic() < deadline, f"requests counted {counted[-6:]}, changes applied {applied[-6:]}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
            requests = sum((await metric(fresh, url, "prefix_router_requests_total")).values())
            changes = await metric(fresh, url, "prefix_router_replication_applied_changes_total")
        assert requests <= 20
        if requests < 20:  # this process has not heard all the counts yet: start the run of six again
            counted, applied = [], []
        else:
            counted, applied = [*counted, requests], [*applied, sum(changes.values())]
        await asyncio.sleep(0.1)
    served.signal(signal.SIGTERM)
    assert await asyncio.wait_for(served.process.wait(), 30) == 0


@pytest.mark.timeout(120)
async def test_every_process_learns_the_token_units_from_every_report(
    fake_engine: Any, serve_process: Any
) -> None:
    """What a report teaches the token units reaches the other processes: each one counts all 16 samples
    (each learned only from the reports of the requests it served: about half), so they value matches
    alike (before: 800 tokens in one process, 686 in the other for one prompt)."""
    engine = await fake_engine("a", prompt_tokens=700)
    served = await serve_process(
        "--worker", f"a={engine.url}", "--processes", "2", "--set", "log_level=warning",
        "--set", "scrape.interval_s=3600",
    )  # fmt: skip
    for i in range(16):  # distinct long prompts (a sample needs routing.units.min_sample_tokens)
        body = {"model": "m", "messages": [{"role": "user", "content": f"{i} " + "lorem ipsum dolor " * 200}]}
        connector = aiohttp.TCPConnector(force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.post(served.url + PATH, json=body) as r,
        ):
            assert r.status == 200
    deadline = time.monotonic() + 10.0  # the samples go out within 50 ms; a loaded machine may take longer
    while True:
        seen = set()
        for _ in range(8):  # fresh connections: the kernel picks the process
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                seen.add(sum((await metric(fresh, served.url, "prefix_router_units_samples_total")).values()))
        if seen == {16} or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert seen == {16}


@pytest.mark.timeout(120)
async def test_a_repeat_sent_right_after_the_answer_is_predicted_whichever_process_takes_it(
    fake_engine: Any, serve_process: Any
) -> None:
    """Back-to-back identical requests, each on a fresh connection (the kernel picks the process): the
    placement of the first reaches the other process before its engine could answer, so every repeat is
    predicted a match (before: 0 in 3 of 4 runs when the sibling took the repeat, its view 10 ms late)."""
    engine = await fake_engine("a")
    served = await serve_process(
        "--worker", f"a={engine.url}", "--processes", "2", "--set", "log_level=warning",
        "--set", "scrape.interval_s=3600",
    )  # fmt: skip
    predicted = []
    for i in range(16):
        body = {"model": "m", "messages": [{"role": "user", "content": f"{i} " + "a prompt to repeat " * 20}]}
        for _ in range(2):
            connector = aiohttp.TCPConnector(force_close=True)
            async with (
                aiohttp.ClientSession(connector=connector) as http,
                http.post(served.url + PATH, json=body) as r,
            ):
                assert r.status == 200
                await r.read()
                match = int(r.headers["x-prefix-router-prefix-match"])
        predicted.append(match)
    assert min(predicted) > 0, predicted


@pytest.mark.timeout(120)
async def test_a_killed_process_is_replaced_and_the_supervisor_takes_its_children_along(
    fake_engine: Any, serve_process: Any
) -> None:
    engine = await fake_engine("a")
    served = await serve_process(
        "--worker", f"a={engine.url}", "--processes", "2", "--set", "log_level=warning"
    )
    proc = served.process
    first = children(proc.pid)
    assert len(first) == 2
    os.kill(first[0], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while len(set(children(proc.pid)) - {first[0]}) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    now = children(proc.pid)
    assert len(now) == 2 and first[0] not in now
    # served again within the deadline: the other process may itself still be starting (on a loaded
    # machine, the first answer that ``serve_process`` waits for can come before both listen), and then the
    # port refuses connections until one of the two does
    assert await served_within(served.url, deadline=time.monotonic() + 30) == 200
    proc.kill()  # the supervisor dies without a word: its children get SIGTERM from the kernel
    await proc.wait()
    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in now) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not any(alive(pid) for pid in now)


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


TOKEN = "admin-token-for-process-tests"


async def views(url: str, n: int = 8) -> list[dict[str, dict[str, Any]]]:
    """The admin view of the workers from ``n`` fresh connections (the kernel spreads them)."""
    out = []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for _ in range(n):
        connector = aiohttp.TCPConnector(force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.get(url + "/admin/workers", headers=headers) as resp,
        ):
            body = await resp.json()
        out.append({w["name"]: w for w in body["workers"]})
    return out


async def until_every_view(url: str, check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(check(view) for view in await views(url)):
        assert time.monotonic() < deadline, "not every process got there"
        await asyncio.sleep(0.1)


@pytest.mark.timeout(120)
async def test_admin_changes_and_health_verdicts_reach_every_process(
    fake_engine: Any, serve_process: Any
) -> None:
    a, b = await fake_engine("a"), await fake_engine("b")
    served = await serve_process(
        "--worker", f"a={a.url}", "--processes", "2", "--set", "log_level=warning",
        "--set", f"auth.admin_token={TOKEN}", "--set", "health.interval_s=0.2",
        "--set", "health.fail_threshold=1",
    )  # fmt: skip
    url = served.url
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/admin/workers", json={"url": b.url, "name": "b"}, headers=headers) as r:
            assert r.status == 201
        await until_every_view(url, lambda view: set(view) == {"a", "b"})
        async with http.post(url + "/admin/workers/a/drain", headers=headers) as r:
            assert r.status == 200
        await until_every_view(url, lambda view: view["a"]["draining"])
        b.b.health_status = 503  # process 0 probes it, every process ejects it
        await until_every_view(url, lambda view: "b" in view and not view["b"]["healthy"])
        checks = a.health_checks
        await asyncio.sleep(2.0)
        assert a.health_checks - checks <= 13  # one prober every 0.2 s, not two
        async with http.delete(url + "/admin/workers/b", headers=headers) as r:
            assert r.status == 200
        await until_every_view(url, lambda view: set(view) == {"a"})
    served.signal(signal.SIGTERM)
    assert await asyncio.wait_for(served.process.wait(), 30) == 0


@pytest.mark.timeout(120)
async def test_sighup_reaches_every_process(fake_engine: Any, serve_process: Any, tmp_path: Path) -> None:
    """The supervisor passes SIGHUP on: every process reloads the file (here: the client keys)."""
    engine = await fake_engine("a")
    config = tmp_path / "router.yaml"
    config.write_text(f"workers: [{{url: '{engine.url}', name: a}}]\nauth: {{api_keys: [key-one-123456]}}\n")
    served = await serve_process("--config", str(config), "--processes", "2", "--set", "log_level=warning")
    proc, url = served.process, served.url

    async def statuses(key: str) -> list[int]:
        out = []
        for _ in range(8):  # fresh connections: the kernel spreads them over the processes
            connector = aiohttp.TCPConnector(force_close=True)
            headers = {"Authorization": f"Bearer {key}"}
            async with (
                aiohttp.ClientSession(connector=connector) as http,
                http.post(url + PATH, json=CHAT, headers=headers) as resp,
            ):
                await resp.read()
                out.append(resp.status)
        return out

    assert await statuses("key-one-123456") == [200] * 8
    config.write_text(f"workers: [{{url: '{engine.url}', name: a}}]\nauth: {{api_keys: [key-two-654321]}}\n")
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while await statuses("key-two-654321") != [200] * 8:
        assert time.monotonic() < deadline, "not every process reloaded"
        await asyncio.sleep(0.2)
    assert await statuses("key-one-123456") == [401] * 8
    assert proc.returncode is None
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0


def _mark(index: int, directory: Path, plan: FanoutPlan) -> None:
    (directory / f"served-{index}").write_text("")


def test_a_process_whose_supervisor_died_before_it_started_does_not_serve(tmp_path: Path) -> None:
    """The supervisor can die between the fork and the child's request for SIGTERM on its death: such a
    child must not go on serving (an orphan holding the port). Here: a parent pid that is not the child's."""
    context = multiprocessing.get_context("fork")
    for supervisor, served in ((os.getpid(), True), (os.getpid() + 1_000_000, False)):
        child = context.Process(
            target=processes._child, args=(_mark, 0, tmp_path, processes.FanoutPlan(), supervisor)
        )
        child.start()
        child.join(30)
        assert child.exitcode == 0
        assert (tmp_path / "served-0").exists() is served
        (tmp_path / "served-0").unlink(missing_ok=True)


class FakeChild:
    """A child for ``_watch``: alive until ``die`` (exit ``code``)."""

    def __init__(self) -> None:
        self.alive, self.exitcode = True, None

    def is_alive(self) -> bool:
        return self.alive

    def join(self) -> None:
        pass


def test_each_child_has_its_own_restart_budget_per_window_and_none_is_abandoned() -> None:
    """One child crash-looping spends its own budget (3 in 60 s here) but not the other's, is restarted
    again once the window allows it (before: 10 restarts per supervisor lifetime, shared, then never),
    and the watch ends once stopping."""
    now = [0.0]
    children: dict[int, Any] = {0: FakeChild(), 1: FakeChild()}
    started: list[tuple[int, float]] = []
    stop = [False]

    def start(index: int) -> None:
        started.append((index, now[0]))
        children[index] = FakeChild()

    def tick(_: float) -> None:
        now[0] += 1.0
        if now[0] < 200 and 0 in children:
            children[0].alive = False  # child 0 dies every second it runs
            children[0].exitcode = 1
        if now[0] == 10:
            children[1].alive = False
        if now[0] >= 200:
            stop[0] = True
            for child in children.values():
                child.alive, child.exitcode = False, -signal.SIGTERM

    worst = _watch(children, start, lambda: stop[0], RestartBudget(3, 60.0), lambda: now[0], tick)
    assert worst == 0
    zero = [at for index, at in started if index == 0]
    assert zero[:3] == [1.0, 2.0, 3.0]
    assert zero[3] == 61.0  # its budget spent at 1, 2, 3: the fourth waits for the window
    assert all(later - earlier >= 60.0 for earlier, later in zip(zero, zero[3:], strict=False))
    assert len(zero) >= 9  # never abandoned: about 3 a minute over 200 s
    assert (1, 10.0) in started  # child 1's budget is its own


def test_a_restart_budget_forgets_restarts_older_than_its_window() -> None:
    budget = RestartBudget(2, 10.0)
    assert budget.next_at(0, 0.0) == 0.0
    budget.spend(0, 0.0)
    budget.spend(0, 1.0)
    assert budget.next_at(0, 2.0) == 10.0
    assert budget.next_at(1, 2.0) == 2.0
    budget.spend(0, 10.0)
    assert budget.next_at(0, 10.5) == 11.0
