"""``bench``, ``demo`` and ``bench-index`` end to end on small sizes, with real simulated engines."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from prefix_router.lab.bench import cli, demo
from prefix_router.lab.bench.commands import arrivals_from, parse_key_values, requests_for
from prefix_router.lab.bench.index_bench import IndexBenchSettings, run
from prefix_router.lab.bench.index_cap import CapBenchSettings
from prefix_router.lab.launch.engine_sim import start_engines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prefix-router")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


@pytest.fixture(scope="module")
def sim_workers() -> Iterator[list[str]]:
    with start_engines(2, profile="cpu-demo", kv_capacity_tokens=8192, time_scale=0.2) as urls:
        yield urls


def test_bench_command_writes_json_and_report(sim_workers: list[str], tmp_path: Path) -> None:
    args = _parser().parse_args([
        "bench", "--workers", *sim_workers, "--policies", "random,prefix", "--workload", "chatbots",
        "--workload-opt", "tenants=4", "--workload-opt", "system_tokens=128", "--requests", "16",
        "--concurrency", "4", "--json", str(tmp_path / "out.json"), "--report", str(tmp_path / "rep"),
        "--no-progress", "--routing", "policies.prefix.load_factor=1.5",
    ])  # fmt: skip
    assert args.func(args) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["simulated"] is True and set(doc["policies"]) == {"random", "prefix"}
    assert all(p["requests"] == 16 and p["errors"] == 0 for p in doc["policies"].values())
    assert doc["policies"]["prefix"]["hit_rate"] > 0
    names = sorted(p.name for p in (tmp_path / "rep").iterdir())
    assert names == ["hit_rate.png", "requests_per_worker.png", "results.json", "table.txt", "ttft_cdf.png"]
    assert "SIMULATED" in (tmp_path / "rep" / "table.txt").read_text()


def test_bench_records_one_line_per_request(sim_workers: list[str], tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    args = _parser().parse_args([
        "bench", "--workers", *sim_workers, "--policies", "prefix", "--workload", "chatbots",
        "--workload-opt", "tenants=2", "--workload-opt", "system_tokens=64", "--requests", "6",
        "--concurrency", "2", "--no-progress", "--records", str(out),
    ])  # fmt: skip
    assert args.func(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and {r["policy"] for r in rows} == {"prefix"}
    assert all(r["ok"] and r["ttft_s"] > 0 and r["e2e_s"] >= r["ttft_s"] and r["worker"] for r in rows)
    assert all(r["prompt_tokens"] > 0 and r["cached_tokens"] is not None for r in rows)


def test_bench_writes_the_routers_decisions_for_the_replay(sim_workers: list[str], tmp_path: Path) -> None:
    out = tmp_path / "decisions.jsonl"
    args = _parser().parse_args([
        "bench", "--workers", *sim_workers, "--policies", "prefix,round_robin", "--workload", "chatbots",
        "--workload-opt", "tenants=2", "--workload-opt", "system_tokens=64", "--requests", "6",
        "--concurrency", "2", "--no-progress", "--decisions", str(out),
    ])  # fmt: skip
    assert args.func(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["policy"] for r in rows] == ["prefix"] * 6 + ["round_robin"] * 6
    assert all(r["status"] == 200 and r["observed_ttft_ms"] > 0 and r["simulated"] for r in rows)
    assert [r["seq"] for r in rows[:6]] == list(range(6))  # in order, none lost
    urls = " ".join(sim_workers)
    assert not any(r["worker"] in urls for r in rows)  # default names are addresses: shown hashed
    from prefix_router.lab.launch.replay import Replay, load

    assert Replay(load(out, "round_robin")).document(1e9)["decisions_total"] <= 6


def test_demo_against_given_workers(
    sim_workers: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parser().parse_args([
        "demo", "--workers", *sim_workers, "--requests", "12", "--rate", "40", "--workload", "unique",
        "--workload-opt", "prompt_tokens=64", "--json", str(tmp_path / "demo.json"), "--no-progress",
    ])  # fmt: skip
    assert args.func(args) == 0
    doc = json.loads((tmp_path / "demo.json").read_text())
    assert doc["simulated"] is True and list(doc["policies"]) == [
        "random",
        "round_robin",
        "least_load",
        "prefix",
    ]
    out = capsys.readouterr().out
    assert "SIMULATED ENGINES" in out and "prefix vs random" in out


def test_demo_llama_error_is_clear(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PREFIX_ROUTER_LLAMA_VENV", str(tmp_path / "absent"))
    args = _parser().parse_args(["demo", "--engine", "llama-cpp", "--no-progress"])
    assert args.func(args) == 2


def test_demo_vllm_error_is_clear(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PREFIX_ROUTER_VLLM_VENV", str(tmp_path / "absent"))
    args = _parser().parse_args(["demo", "--engine", "vllm", "--no-progress"])
    assert demo.instances(args) == 2 and demo.setting_for(args) is demo.VLLM_SETTING
    assert args.func(args) == 2
    error = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("error:"))
    assert str(tmp_path / "absent") in error and error.endswith("(run make vllm)")  # one line, however long


def test_verdict_compares_prefix_with_random() -> None:
    doc = {"policies": {
        "random": {"ttft_ms": {"p50": 90.0}, "hit_rate": 0.4},
        "prefix": {"ttft_ms": {"p50": 30.0}, "hit_rate": 0.8},
    }}  # fmt: skip
    assert demo.verdict(doc) == [
        "prefix vs random: TTFT p50 3.00x lower (30.0 ms vs 90.0 ms); engine-reported hit rate 80.0% vs 40.0%"
    ]
    assert demo.verdict({"policies": {"prefix": doc["policies"]["prefix"]}}) == []


def test_argument_helpers() -> None:
    assert parse_key_values(["a=1", "b = x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ValueError):
        parse_key_values(["novalue"])
    args = _parser().parse_args(["bench", "--workers", "http://h", "--duration", "10", "--rate", "2",
                                 "--workload", "chatbots"])  # fmt: skip
    assert requests_for(args, arrivals_from(args)) == 46
    assert requests_for(args, None) == 136  # the workload's default arrivals (8/s)
    args = _parser().parse_args(["bench", "--workers", "http://h", "--duration", "10", "--concurrency", "2"])
    assert requests_for(args, arrivals_from(args)) == 20_000


def test_bench_index_small() -> None:
    cap = CapBenchSettings(workers=8, total_blocks=2000, request_blocks=50, requests=5)
    result = run(IndexBenchSettings(workers=4, blocks=1000, prompt_chars=(1600,), repeats=3, cap=cap))
    assert result["indexed_blocks"] == 1000 and result["bytes_per_block"] > 0
    prompt = result["prompts"]["1600"]
    assert prompt["blocks"] == 25
    assert all(prompt[k]["p50"] > 0 for k in ("key_us", "miss_route_us", "hit_route_us"))
    capped = result["global_cap"]  # both indexes stay at their cap, evicting a block per new one
    assert all(
        capped[k]["entries"] == 2000 and capped[k]["evicted_blocks"] == 250 for k in ("buckets", "scan")
    )


def test_verdict_says_higher_when_prefix_is_slower() -> None:
    doc = {"policies": {
        "random": {"ttft_ms": {"p50": 50.0}, "hit_rate": None},
        "prefix": {"ttft_ms": {"p50": 55.0}, "hit_rate": None},
    }}  # fmt: skip
    assert "TTFT p50 1.10x higher" in demo.verdict(doc)[0] and "n/a vs n/a" in demo.verdict(doc)[0]


@pytest.mark.parametrize("command", ["bench", "demo", "simulate"])
def test_a_bad_workload_option_exits_2_with_one_line(command: str) -> None:
    """``--workload-opt shuffle=ture`` used to become False silently; now the command stops, naming it."""
    argv = [command, "--workload", "multi-turn", "--workload-opt", "shuffle=ture"]
    argv += ["--workers", "http://127.0.0.1:9"] if command == "bench" else []
    argv += ["--instances", "2", "--policies", "random"] if command == "simulate" else []
    proc = subprocess.run(
        [sys.executable, "-c", "from prefix_router.cli import main; main()", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert "workload multi-turn: option shuffle: Input should be a valid boolean" in lines[0]


def test_a_terminated_demo_stops_its_engines() -> None:
    """SIGTERM while the demo runs: it exits (143) after stopping its engine processes."""
    argv = ["demo", "--engines", "2", "--engine-opt", "time_scale=0.02", "--requests", "400", "--no-progress"]
    demo_proc = subprocess.Popen(
        [sys.executable, "-c", "from prefix_router.cli import main; main()", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while len(started) < 2:
            assert demo_proc.poll() is None and time.monotonic() < deadline, (
                "the demo's engines did not start"
            )
            time.sleep(0.1)
            started = engine_children(psutil.Process(demo_proc.pid))
        time.sleep(1.0)  # into the run
        demo_proc.terminate()
        assert demo_proc.wait(30) == 143
        gone, alive = psutil.wait_procs(started, timeout=10)
        assert alive == [] and len(gone) == 2
    finally:  # whatever failed: no process of the demo's outlives the test
        left = engine_children(psutil.Process(demo_proc.pid)) if demo_proc.poll() is None else []
        demo_proc.kill()
        for engine in {*started, *left}:
            if engine.is_running():
                engine.kill()


def engine_children(parent: psutil.Process) -> list[psutil.Process]:
    try:
        children = parent.children()
    except psutil.NoSuchProcess:
        return []
    return [c for c in children if "prefix_router.lab.sim" in c.cmdline()]  # python -m prefix_router.lab.sim
