from __future__ import annotations

from typing import Any

from prefix_router.lab.sim.matrix_targets import evaluate, failures, markdown


def row(hit: float, p50: float, p99: float, mean: float, imbalance: float = 1.0) -> dict[str, Any]:
    return {
        "hit_rate": hit,
        "ttft_ms": {"p50": p50, "p90": p99, "p99": p99, "mean": mean},
        "prefill_tokens": 1_000_000,
        "load_imbalance": imbalance,
    }


def cell(prefix: dict[str, Any], load: str = "hot") -> dict[str, Any]:
    policies = {
        "random": row(0.2, 100, 900, 300),
        "least_load": row(0.25, 80, 700, 250),
        "sglang_cache_aware": row(0.5, 60, 2000, 400),
        "prefix": prefix,
    }
    extra = {
        "utilisation": {"busy_fraction": 0.8},
        "queue_wait_ms": {"p99": 5.0},
        "replication": {"mean": 1.1},
    }
    report = {
        "policies": policies,
        "details": dict.fromkeys(policies, extra),
        "oracle": {"hit_rate": 0.5},
        "instances": 4,
        "profile": "p",
        "capacity_tokens_per_instance": 1000,
        "rate_scale": 1.0,
    }
    return {
        "workload": "w",
        "load": load,
        "cache": "large",
        "description": "d",
        "requests": 10,
        "report": report,
    }


def test_every_target_met() -> None:
    result = evaluate(cell(row(0.49, 50, 650, 200, 1.1)))
    assert result["ok"] and set(result["checks"]) == {"hit", "p50", "p99", "mean", "imbalance"}


def test_each_target_can_fail() -> None:
    assert not evaluate(cell(row(0.47, 50, 650, 200)))["checks"]["hit"]["ok"]  # 94 % of the oracle
    assert not evaluate(cell(row(0.49, 90, 650, 200)))["checks"]["p50"]["ok"]  # least_load has 80
    assert not evaluate(cell(row(0.49, 50, 750, 200)))["checks"]["p99"]["ok"]  # least_load has 700
    assert not evaluate(cell(row(0.49, 50, 650, 450)))["checks"]["mean"]["ok"]  # sglang has 400
    assert not evaluate(cell(row(0.49, 50, 650, 200, 1.3)))["checks"]["imbalance"]["ok"]
    assert "imbalance" not in evaluate(cell(row(0.49, 50, 650, 200, 1.3), load="cold"))["checks"]


def test_failures_and_markdown_name_the_cell() -> None:
    bad = cell(row(0.4, 50, 650, 200))
    assert failures([bad]) == ["w/hot/large: hit 0.8 (bound 0.97)"]
    text = markdown({"cells": [bad]})
    assert "w / hot / large" in text and "SIMULATED" in text and "| **prefix** |" in text
