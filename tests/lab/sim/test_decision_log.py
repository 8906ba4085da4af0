"""``simulate --decisions FILE``: every decision of every policy, with its outcome, as the admin endpoint
shows one, marked simulated; no text, hashed tenants and prefixes."""

from __future__ import annotations

from pathlib import Path

import orjson

from prefix_router.cli import main as cli_main


def simulate_to(path: Path, limit: int = 120) -> list[dict[str, object]]:
    argv = ["simulate", "--workload", "chatbots", "--instances", "3", "--policies", "prefix,round_robin",
            "--limit", str(limit), "--decisions", str(path), "--no-progress"]  # fmt: skip
    try:
        cli_main(argv)
    except SystemExit as done:
        assert done.code == 0
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_simulate_writes_every_decision_and_its_outcome(tmp_path: Path) -> None:
    views = simulate_to(tmp_path / "d.jsonl")
    assert len(views) == 2 * 120
    assert {v["policy"] for v in views} == {"prefix", "round_robin"}
    assert all(v["simulated"] is True and v["status"] == 200 for v in views)
    assert all(v["observed_ttft_ms"] > 0 and v["reported_prompt_tokens"] > 0 for v in views)
    assert {v["worker"] for v in views} == {"engine-000", "engine-001", "engine-002"}
    prefix = [v for v in views if v["policy"] == "prefix"]
    assert any(v["cached_tokens"] > 0 for v in prefix) and any(v["branch"] == "prefix_hit" for v in prefix)
    assert all(str(v["tenant"]).startswith("t-") or v["tenant"] is None for v in views)
    assert all(str(v["prefix"]).startswith("p-") for v in views)
