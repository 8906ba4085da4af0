"""``benchmarks/vllm_real.py``'s plan, fleet settings and ideal hit rate; no engine is started."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from prefix_router.lab.launch import vllm
from support.scripts import benchmark_module


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with benchmark_module("vllm_real.py") as module:
        yield module


def _record(session: str, start: float, prompt: int, cached: int) -> dict[str, Any]:
    return {"session_id": session, "start_s": start, "prompt_tokens": prompt, "cached_tokens": cached}


def test_n_engines_on_consecutive_ports_alternating_cores(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm.os, "cpu_count", lambda: 2)
    settings = bench.fleet_settings(bench.parse_args(["--out", str(tmp_path), "--instances", "4"]))
    assert settings.instances == 4 and settings.port_base == 18710
    assert [vllm.core_for(settings, i) for i in range(4)] == ["0", "1", "0", "1"]
    assert settings.blocks() == 28  # the default 3,584 tokens
    assert bench.fleet_settings(bench.parse_args([])).instances == 3


def test_shared_cell_has_a_share_of_tenants_per_engine(bench: ModuleType) -> None:
    for n in (2, 3, 4):
        ((cell, routers),) = bench.parse_plan("shared:random,prefix,sglang", n)
        assert cell.workload_options()["tenants"] == str(bench.PROMPTS_PER_ENGINE * n)
        assert [r.kind for r in routers] == ["prefix-router", "prefix-router", "sglang-router"]
    ((cell, _),) = bench.parse_plan("shared:random", 2, prompts_per_engine=4)
    assert cell.workload_options()["tenants"] == "8"
    with pytest.raises(KeyError):
        bench.parse_plan("shared:nope", 3)


def test_shared_groups_are_tenants(bench: ModuleType) -> None:
    cell = bench.cells(2)["shared"]
    groups = bench.prefix_groups(cell, 40, seed=0)
    tenants = {f"tenant-{i}" for i in range(6)}
    assert len(groups.of) == 40 and set(groups.of.values()) == tenants and groups.tenants == tenants


def test_ideal_counts_repeat_visits_of_a_tenant(bench: ModuleType) -> None:
    groups = bench.Groups({"a": "t0", "b": "t0", "c": "t1", "d": "t0"}, frozenset({"t0", "t1"}))
    records = [_record("b", 1.0, 900, 0), _record("a", 0.0, 900, 0), _record("c", 2.0, 900, 0),
               _record("d", 3.0, 900, 0)]  # fmt: skip
    assert bench.ideal_cached(records, groups, 128, {"t0": 768, "t1": 640}) == 2 * 768


def test_ideal_counts_the_previous_turns_whole_blocks(bench: ModuleType) -> None:
    groups = bench.Groups({"c/turn-0": "c", "c/turn-1": "c", "c/turn-2": "c", "x": "x"}, frozenset())
    records = [_record("c/turn-0", 0.0, 300, 0), _record("x", 0.5, 500, 0),
               _record("c/turn-1", 1.0, 700, 0), _record("c/turn-2", 2.0, 1000, 0)]  # fmt: skip
    assert bench.ideal_cached(records, groups, 128, {}) == 256 + 640
    assert bench.tenant_cacheable([[_record("c/turn-1", 1.0, 700, 512)]], groups) == {}


def test_with_ideal_takes_each_tenants_best_report_from_any_run(bench: ModuleType, tmp_path: Path) -> None:
    cell = bench.cells(2)["shared"]
    groups = bench.Groups({"a": "t0", "b": "t0"}, frozenset({"t0"}))
    rows = []
    for name, cached in (("blind", 0), ("aware", 768)):
        path = tmp_path / f"{name}.records.jsonl"
        lines = [_record("a", 0.0, 1000, 0), _record("b", 1.0, 1000, cached)]
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
        rows.append({"cell": "shared", "records": str(path)})
    rows.append({"cell": "unique", "records": None})
    bench.with_ideal(rows, cell, groups, 128)
    assert [r.get("ideal_hit_rate") for r in rows] == [0.384, 0.384, None]


def test_no_ideal_where_sessions_carry_their_generated_replies(bench: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "r.records.jsonl"
    path.write_text(json.dumps(_record("s", 0.0, 500, 0)) + "\n")
    rows = [{"cell": "multiturn", "records": str(path)}]
    bench.with_ideal(rows, bench.cells(2)["multiturn"], bench.Groups({"s": "s"}, frozenset(), False), 128)
    assert "ideal_hit_rate" not in rows[0]
    bench.with_ideal(rows, bench.cells(2)["multiturn"], bench.Groups({"s": "s"}, frozenset(), True), 128)
    assert rows[0]["ideal_hit_rate"] == 0.0


def test_rounds_rotate_the_routers_order(bench: ModuleType) -> None:
    routers = [bench.ROUTERS[name] for name in ("prefix", "sglang", "smg", "vllm")]
    orders = [[r.kind for r in bench.rotated(routers, k)] for k in range(5)]
    assert orders[0] == ["prefix-router", "sglang-router", "smg", "vllm-router"]
    assert orders[1] == ["sglang-router", "smg", "vllm-router", "prefix-router"]
    assert orders[4] == orders[0] and len({tuple(o) for o in orders}) == 4


def test_smg_is_launched_cache_aware_on_loopback(bench: ModuleType, tmp_path: Path) -> None:
    cmd = bench.router_command(bench.ROUTERS["smg"], ["http://127.0.0.1:1"], 9000, 9001, tmp_path)
    assert cmd[:2] == [str(tmp_path / "bin" / "smg"), "launch"]
    assert cmd[cmd.index("--policy") + 1] == "cache_aware"
    assert cmd[cmd.index("--host") + 1] == cmd[cmd.index("--prometheus-host") + 1] == "127.0.0.1"
    assert bench.router_env(bench.ROUTERS["smg"])["HF_HUB_OFFLINE"] == "1"
    serve = bench.router_command(bench.ROUTERS["prefix"], ["http://127.0.0.1:1"], 9000, 9001, tmp_path, True)
    assert serve[-1] == "log_level=info"


def test_prediction_error_is_the_median_after_warm_up(bench: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "router.log"
    lines = [f"method=POST status=200 predicted_ttft_ms={p} ttft_ms={o} duration_ms=9"
             for p, o in ((1000, 10), (1000, 10), (110, 100), (80, 100), (150, 100))]  # fmt: skip
    log.write_text("\n".join(["starting", *lines]) + "\n")
    got = bench.prediction_errors(log, warmup=2)
    assert got == {"requests": 3, "warmup": 2, "mdape": pytest.approx(0.2)}
    log.write_text("method=POST status=200 predicted_ttft_ms=none ttft_ms=12.0\n")
    assert bench.prediction_errors(log) is None
    assert bench.prediction_errors(tmp_path / "missing.log") is None


def _run(
    router: str, kind: str, concurrency: int, prompt: int, cached: int, mean: float, n: int
) -> dict[str, Any]:
    return {"cell": "shared", "router": router, "kind": kind, "concurrency": concurrency, "round": 0,
            "requests": n, "prompt_tokens": prompt, "cached_tokens": cached, "ttft_ms": {"mean": mean},
            "predictions": None}  # fmt: skip


def test_peer_summary_pools_rounds_and_compares_with_the_best_peer(bench: ModuleType) -> None:
    rows = [
        _run("prefix-router prefix", "prefix-router", 4, 1000, 800, 100.0, 10),
        _run("prefix-router prefix", "prefix-router", 4, 1000, 900, 200.0, 30),  # a second round
        _run("sglang-router cache_aware", "sglang-router", 4, 2000, 1600, 250.0, 40),
        _run("smg cache_aware", "smg", 4, 2000, 1000, 125.0, 40),
    ]
    text = bench.peer_summary(rows)
    (prefix,) = [line for line in text.splitlines() if "prefix-router prefix" in line]
    # pooled: hit 1700 / 2000 = 85 %, +5 points on sglang's 80 %; TTFT (10 x 100 + 30 x 200) / 40 = 175 ms,
    # 1.40x smg's 125 (the lowest peer mean)
    assert "| 4 | prefix-router prefix | 2 | 85.0 % | +5.0 pt | 175 | 1.40x | n/a |" in prefix


def _timed(worker: str, start: float, ttft: float, prompt: int, cached: int) -> dict[str, Any]:
    return {"ok": True, "worker": worker, "start_s": start, "ttft_s": ttft, "e2e_s": ttft + 0.05,
            "prompt_tokens": prompt, "cached_tokens": cached}  # fmt: skip


def _engine_run(noise: float, n: int = 60) -> list[dict[str, Any]]:
    """Requests one after another on two workers whose first-token time is 20 ms + 1 ms per uncached
    token, each off by +-``noise`` (alternately)."""
    out = []
    for i in range(n):
        uncached = 10 + (i * 37) % 300
        ttft = (0.02 + 0.001 * uncached) * (1 + noise * (-1) ** i)
        out.append(_timed(f"w{i % 2}", float(i), ttft, 1000, 1000 - uncached))
    return out


def test_hindsight_error_is_that_of_the_best_fit_of_what_the_engines_did(bench: ModuleType) -> None:
    assert bench.hindsight_error(_engine_run(0.0)) == pytest.approx(0.0, abs=1e-6)  # a line explains it all
    assert bench.hindsight_error(_engine_run(0.3)) == pytest.approx(0.3, abs=0.05)  # the noise is left
    assert bench.hindsight_error(_engine_run(0.0, n=20)) is None  # too few requests after the warm-up


def test_hindsight_counts_the_work_ahead_and_sent_during_a_request_s_wait(bench: ModuleType) -> None:
    # on one worker, each first token waits for the uncached tokens ahead and those sent during its wait:
    # without those two features no line fits; with them the fit is exact
    rows, clock = [], 0.0
    for i in range(40):
        ahead = 0 if i % 3 == 0 else 200
        rows.append(_timed("w", clock, 0.05 + 0.002 * ahead, 1000, 950))
        if ahead:  # the request that was ahead: sent just before, first token after this one's send
            rows.append(_timed("w", clock - 0.001, 0.002 * ahead, 1000, 1000 - ahead))
        clock += 1.0
    assert bench.hindsight_error(rows, warmup=0) < 0.1


def test_the_table_shows_each_engine_s_preemptions_or_says_it_does_not_know(bench: ModuleType) -> None:
    row = {"cell": "shared", "router": "ttft", "engine_cpu_s": [1.0, 2.0], "router_cpu_s": 0.1,
           "load_avg_start": 1, "load_avg_end": 2, "ttft_ms": {"mean": 5.0}}  # fmt: skip
    counted = bench.table([{**row, "preemptions_per_worker": {"a": 3, "b": 0}}]).splitlines()
    unknown = bench.table([row]).splitlines()
    assert "preempted" in counted[0] and "| 3 + 0 |" in counted[2]
    assert "| n/a |" in unknown[2] and counted[0].count("|") == counted[2].count("|")


def test_the_hindsight_fit_on_what_a_router_knows_leaves_out_the_later_arrivals(bench: ModuleType) -> None:
    # two requests on one worker wait for a prompt of 0 to 400 uncached tokens sent during their wait (their
    # step takes it in): only the fit with the later arrivals explains their first-token times
    rows = []
    for i in range(30):
        extra = (i * 97) % 401
        rows.append(_timed("w", float(i), 0.05 + 0.001 * extra, 1000, 950))
        rows.append(_timed("w", i + 0.001, 0.05 + 0.001 * extra, 1000, 950))
        rows.append(_timed("w", i + 0.01, 0.1, 1000, 1000 - extra))  # the later arrival
    assert bench.hindsight_error(rows, warmup=0) < 0.05
    assert bench.hindsight_error(rows, warmup=0, later=False) > 0.2
    row = {"records": None}
    bench.with_hindsight(row)
    assert row == {"records": None, "hindsight_mdape": None, "hindsight_known_mdape": None}
