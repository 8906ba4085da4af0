"""``benchmarks/epp.py``'s plan for part 2 in front of simulated engines (the default) or real vLLM ones
(``--engines vllm``, ``VllmFleet``) and its table's cells and verdicts; no engine is started here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from prefix_router.lab.launch.vllm import VllmFleet
from support.scripts import benchmark_module


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with benchmark_module("epp.py") as module:
        yield module


def test_simulated_engines_by_default(bench: ModuleType, tmp_path: Path) -> None:
    args = bench.parse_args([])
    plan = bench.engine_plan(args)
    assert plan.simulated and plan.instances == 4 and "simulated" in plan.describe()
    argv = bench.bench_argv("http://127.0.0.1:1", ["http://e"], "serve", args, tmp_path / "o.json")
    assert "--simulated" in argv


def test_vllm_engines_two_real_instances(bench: ModuleType, tmp_path: Path) -> None:
    args = bench.parse_args(["--engines", "vllm", "--skip-data-path", "--hit-requests", "50"])
    plan = bench.engine_plan(args)
    assert not plan.simulated and plan.instances == 2 and "real vLLM" in plan.describe()
    argv = bench.bench_argv("http://127.0.0.1:1", ["http://e"], "serve", args, tmp_path / "o.json")
    assert "--simulated" not in argv and argv[argv.index("--requests") + 1] == "50"
    settings = plan.vllm_settings(tmp_path)
    assert settings.instances == 2 and settings.log_dir == tmp_path
    fleet = VllmFleet(settings)  # validated as the run would build it; nothing started
    assert fleet.urls == []


def test_instances_and_engine_kind_checked(bench: ModuleType) -> None:
    assert bench.engine_plan(bench.parse_args(["--engines", "vllm", "--instances", "3"])).instances == 3
    with pytest.raises(SystemExit):
        bench.parse_args(["--engines", "sglang"])


def row(p50_ttft: float | None, p50_e2e: float | None, engines_hit: float | None) -> dict[str, object]:
    """A ``bench`` row with only what the routing table reads."""
    return {
        "requests": 10, "errors": 0, "throughput_rps": 2.5, "ttft_ms": {"p50": p50_ttft},
        "e2e_ms": {"p50": p50_e2e}, "engine_metrics_hit_rate": engines_hit, "hit_rate": engines_hit,
        "requests_per_worker": {"http://127.0.0.1:2": 4, "127.0.0.1:1": 6},
    }  # fmt: skip


def test_latency_added_over_the_direct_row(bench: ModuleType) -> None:
    rows = [
        (bench.SERVE, row(130.0, 400.0, 0.5), {"serve": 0.002}, 10),
        (bench.GATEWAY, row(150.0, 390.0, 0.5), {"envoy": 0.001, "epp": 0.003}, 10),
        (bench.DIRECT, row(100.0, 380.0, 0.25), {}, 10),
    ]
    serve, gateway, direct = bench.routing_cells(rows)
    assert serve[5] == "+30" and serve[7] == "+20"
    assert gateway[5] == "+50" and gateway[7] == "+10"
    assert direct[5] == "+0" and direct[11] == "-"
    assert gateway[11] == "4,000" and gateway[12] == "envoy 1,000 + epp 3,000"
    assert serve[8] == "50.0 %" and direct[8] == "25.0 %"
    assert serve[10] == "6 / 4"  # by address, the scheme ignored


def test_no_direct_row_or_no_latency_means_n_a(bench: ModuleType) -> None:
    cells = bench.routing_cells([(bench.SERVE, row(None, 400.0, None), {"serve": 0.001}, 10)])[0]
    assert cells[4] == "n/a" and cells[5] == "n/a" and cells[7] == "n/a" and cells[8] == "n/a"


def test_verdicts_compare_the_engines_hit_rate_with_serve(bench: ModuleType) -> None:
    rows = [
        (bench.SERVE, row(1.0, 1.0, 0.50), {"serve": 0.002}, 10),
        (bench.GATEWAY, row(1.0, 1.0, 0.52), {"envoy": 0.001, "epp": 0.001}, 10),
        (bench.SGLANG, row(1.0, 1.0, 0.10), {"sglang": 0.001}, 10),
        (bench.SERVE_AGAIN, row(1.0, 1.0, 0.505), {"serve": 0.002}, 10),
    ]
    gateway, again = bench.verdicts(rows)
    assert (
        "+2.00 points" in gateway
        and "within 1: NOT MET" in gateway
        and "0.50, target at or below 1: met" in gateway
    )
    assert "+0.50 points" in again
    assert bench.verdicts(rows[1:]) == []  # nothing to compare with


def test_round_robin_deals_sessions_and_concurrency(bench: ModuleType) -> None:
    args = bench.parse_args(["--workload", "chatbots", "--hit-requests", "9", "--hit-concurrency", "4"])
    workload = bench.bench_workload(args)
    parts = bench.round_robin(workload, 2)
    assert [len(p.sessions) for p in parts] == [5, 4]
    assert [p.concurrency for p in parts] == [2, 2]
    assert parts[0].sessions[1] is workload.sessions[2] and parts[1].sessions[0] is workload.sessions[1]
    assert [p.concurrency for p in bench.round_robin(workload, 8)] == [1] * 8  # at least one each


def test_edges_in_order_and_checked(bench: ModuleType) -> None:
    args = bench.parse_args(["--edges", "direct,prefix-router,envoy+epp", "--peer-python", "/nonexistent"])
    assert bench.edges(args) == [bench.SERVE, bench.GATEWAY, bench.DIRECT]
    no_peer = bench.parse_args(["--edges", "sglang-router,direct", "--peer-python", "/nonexistent"])
    assert bench.edges(no_peer) == [bench.DIRECT]
    with pytest.raises(SystemExit):
        bench.edges(bench.parse_args(["--edges", "nginx"]))


def test_workload_options_reach_bench(bench: ModuleType, tmp_path: Path) -> None:
    args = bench.parse_args(["--hit-workload-opt", "tenants=8", "--hit-workload-opt", "zipf_s=0"])
    argv = bench.bench_argv("http://127.0.0.1:1", ["http://e"], "serve", args, tmp_path / "o.json")
    assert argv[-4:] == ["--workload-opt", "tenants=8", "--workload-opt", "zipf_s=0"]
    sglang = bench.sglang_argv("py", ["http://a", "http://b"], 9)
    assert sglang[sglang.index("--worker-urls") + 1 :][:2] == ["http://a", "http://b"]


def test_each_round_starts_with_another_edge(bench: ModuleType) -> None:
    names = ["a", "b", "c"]
    assert [bench.rotated(names, r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"],
    ]  # fmt: skip
    assert bench.rotated([], 2) == []


def test_the_serve_set_row_runs_serve_with_its_knobs(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit):  # the row without knobs is the defaults' row again: refused
        bench.edges(bench.parse_args(["--edges", "prefix-router set"]))
    knob = "routing.policies.prefix.decoding_penalty_tokens=128"
    args = bench.parse_args(["--edges", "prefix-router,prefix-router set", "--serve-set", knob])
    assert bench.edges(args) == [bench.SERVE, bench.SERVE_SET]
    spawned: list[list[str]] = []
    monkeypatch.setattr(bench, "wait_http", lambda url, timeout_s=60.0: None)
    for label in (bench.SERVE, bench.SERVE_SET):
        bench.start_edge(lambda argv, env: spawned.append(argv) or 1, label, ["http://e"], args, tmp_path)
    plain, tuned = ([a for i, a in enumerate(argv) if argv[i - 1] != "--port"] for argv in spawned)
    assert tuned == [*plain, "--set", knob]  # the same serve, the knob last
