from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

from prefix_router.lab.sim import cli


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="prefix-router")
    cli.register(root.add_subparsers(dest="command", required=True))
    return root


def small_trace(path: Path) -> Path:
    rng = random.Random(0)
    rows = []
    for i in range(60):
        ids = [rng.randrange(4) * 100 + b for b in range(3)] + [10_000 + i]
        rows.append({"timestamp": i * 500, "input_length": 2000, "output_length": 20, "hash_ids": ids})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_simulate_writes_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = small_trace(tmp_path / "t.jsonl")
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = parser().parse_args(
        [
            "simulate",
            "--trace",
            str(trace),
            "--instances",
            "3",
            "--policies",
            "random,prefix",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--no-progress",
        ]
    )
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    assert report["simulated"] is True and set(report["policies"]) == {"random", "prefix"}
    assert report["capacity_tokens_per_instance"] == cli.TRACE_DEFAULT_CAPACITY_TOKENS
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "SIMULATED" in printed and "oracle" in printed


def test_unknown_policy_is_a_usage_error(tmp_path: Path) -> None:
    trace = small_trace(tmp_path / "t.jsonl")
    args = parser().parse_args(["simulate", "--trace", str(trace), "--instances", "2", "--policies", "nope"])
    assert args.func(args) == 2


def test_trace_or_workload_is_required() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["simulate", "--instances", "2"])


def test_engine_sim_options() -> None:
    args = parser().parse_args(["engine-sim", "--port", "0", "--profile", "cpu-demo", "--time-scale", "0.5"])
    assert (args.port, args.profile, args.time_scale, args.host) == (0, "cpu-demo", 0.5, "127.0.0.1")
    assert args.func is cli.run_engine_sim


def test_routing_knobs_come_from_a_serve_config_and_set(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(
        "port: 9000\nrouting:\n  policy: random\n  policies:\n"
        "    prefix: {load_factor: 2.0, recompute_weight: 3}\n"
    )
    sets = ["routing.policies.prefix.load_factor=1.5", "routing.index.max_prefix_blocks=4"]
    knobs = cli.routing_knobs(str(config), sets)
    assert knobs == {
        "policies": {"prefix": {"load_factor": 1.5, "recompute_weight": 3}},
        "index": {"max_prefix_blocks": 4},
    }
    bad = ["load_factor=2", "routing.nope=1", "routing.policies.prefix.load_factor=-1", "port=1"]
    for item in bad:
        with pytest.raises(ValueError):
            cli.routing_knobs(None, [item])


def test_simulate_applies_the_knobs_and_reports_the_readouts(tmp_path: Path) -> None:
    trace = small_trace(tmp_path / "t.jsonl")
    reports = {}
    for name, extra in {"default": [], "short": ["--set", "routing.index.max_prefix_blocks=1"]}.items():
        out = tmp_path / f"{name}.json"
        argv = ["simulate", "--trace", str(trace), "--instances", "3", "--policies", "prefix"]
        args = parser().parse_args([*argv, "--json", str(out), "--no-progress", *extra])
        assert args.func(args) == 0
        reports[name] = json.loads(out.read_text())
    extra = reports["default"]["details"]["prefix"]
    assert 0 < extra["utilisation"]["busy_fraction"] <= 1 and 0 < extra["utilisation"]["prefill_share"] <= 1
    assert set(extra["queue_wait_ms"]) == {"p50", "p90", "p99", "mean"}
    assert extra["replication"]["mean"] >= 1.0 and sum(extra["branches"].values()) == 60
    # the router examines only the first 512-token block: it predicts (and finds) less
    short, default = reports["short"]["policies"]["prefix"], reports["default"]["policies"]["prefix"]
    assert short["predicted_hit_rate"] < default["predicted_hit_rate"]


def test_a_bad_knob_is_a_usage_error(tmp_path: Path) -> None:
    trace = small_trace(tmp_path / "t.jsonl")
    args = parser().parse_args(
        [
            "simulate",
            "--trace",
            str(trace),
            "--instances",
            "2",
            "--set",
            "routing.policies.prefix.load_factor=0",
        ]
    )
    assert args.func(args) == 2


def test_simulate_disaggregated_reports_the_stages(tmp_path: Path) -> None:
    trace = small_trace(tmp_path / "t.jsonl")
    out = tmp_path / "pd.json"
    argv = ["simulate", "--trace", str(trace), "--instances", "3", "--policies", "prefix", "--prefill", "1"]
    args = parser().parse_args([*argv, "--skip-prefill-tokens", "512", "--json", str(out), "--no-progress"])
    assert args.func(args) == 0
    pd = json.loads(out.read_text())["details"]["prefix"]["pd"]
    assert pd["prefills"] + sum(pd["skipped"].values()) == 60 and pd["cold_skipped"] == 0
    assert pd["prefills"] > 0 and pd["transferred_tokens"] > 0
    for bad in (["--prefill", "3"], ["--skip-prefill-tokens", "5"]):
        args = parser().parse_args(["simulate", "--trace", str(trace), "--instances", "3", *bad])
        assert args.func(args) == 2
