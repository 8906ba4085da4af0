"""``prefix-router dashboard --replay FILE``: a simulated run's decisions played back as the router's
dashboard document, over its own small server."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from prefix_router.lab.launch.replay import Replay, build_app, load, moves
from prefix_router.lab.sim.decision_log import DecisionLog
from prefix_router.node.life.server import start
from prefix_router.routing.types import Branch, Decision, RouteRequest


def write(path: Path, plan: list[tuple[float, str, int]]) -> None:
    """Decisions of (time, worker, prefix tag), each one hit of 32 of 64 tokens, 10 ms to first token."""
    with DecisionLog(path, simulated=True) as log:
        for i, (t, worker, tag) in enumerate(plan):
            req = RouteRequest(f"r{i}", (tag, tag + 1), 16, 64, hash_key=tag, namespace=tag)
            log.decided(f"r{i}", t, "prefix", Decision(worker, Branch.PREFIX_HIT, 1, 32, 64), req)
            log.first_token(f"r{i}", 0.01)
            log.finished(f"r{i}", 200, 32, 64)


def test_a_replay_shows_the_runs_workers_feed_series_and_moves(tmp_path: Path) -> None:
    plan = [(float(i), "sim-a" if i < 4 else "sim-b", 1000) for i in range(10)]  # its home moves once
    plan += [(float(i) + 0.5, "sim-c", 2000) for i in range(10)]
    write(tmp_path / "d.jsonl", plan)
    replay = Replay(load(tmp_path / "d.jsonl", None))
    early, late = replay.document(3.0), replay.document(9.9)
    assert early["simulated"] is True and [w["name"] for w in early["workers"]] == ["sim-a", "sim-b", "sim-c"]
    assert early["decisions_total"] == 7 and late["decisions_total"] == 20
    assert [(m["from"], m["to"]) for m in replay.document(6.9)["moves"]] == []  # 3 b against 4 a: still a
    assert early["moves"] == [] and [(m["from"], m["to"]) for m in late["moves"]] == [("sim-a", "sim-b")]
    home = {p["tenant"]: p["holders"][0]["worker"] for p in late["prefixes"]}
    assert sorted(home.values()) == ["sim-b", "sim-c"]
    assert late["series"][0]["hit_reported"] == 0.5 and late["series"][0]["ttft_ms"] == 10.0
    assert {w["name"]: w["decisions"] for w in late["workers"]} == {"sim-a": 4, "sim-b": 6, "sim-c": 10}
    assert moves([]) == []


async def test_the_replay_server_answers_the_page_and_its_data(tmp_path: Path) -> None:
    write(tmp_path / "d.jsonl", [(0.0, "sim-a", 1000), (0.2, "sim-b", 1000)])
    running = await start(build_app(Replay(load(tmp_path / "d.jsonl", None)), speed=100.0))
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(running.url + "/dashboard") as resp:
                assert resp.status == 200 and "dashboard.js" in await resp.text()
            async with http.get(running.url + "/dashboard/data") as resp:
                doc = await resp.json()
            assert doc["simulated"] is True and {w["name"] for w in doc["workers"]} == {"sim-a", "sim-b"}
            async with http.get(running.url + "/dashboard/static/nope.js") as resp:
                assert resp.status == 404
    finally:
        await running.stop()
