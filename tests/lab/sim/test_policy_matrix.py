"""A small version of the policy matrix (docs/benchmarks.md, `prefix-router sim-matrix --small`): one cell
per workload, every policy on the same requests, the issue's targets for ``prefix`` (simulated)."""

from __future__ import annotations

from typing import Any

import pytest

from prefix_router.lab.sim import matrix
from prefix_router.lab.sim.matrix_targets import HIT_OF_ORACLE, evaluate

pytestmark = pytest.mark.slow  # whole-trace simulations: make test runs them, make unit not
# every target holds in these cells of the small matrix
MET = ("mooncake/hot/large", "sharegpt/cold/large", "agents/overload/large", "bursty/hot/small")
# long-document RAG, hot: the hot documents' holders take most (cheap) requests, see docs/benchmarks.md
RAG = "rag-long/hot/large"


@pytest.fixture(scope="module")
def cells() -> dict[str, dict[str, Any]]:
    if not matrix.trace_available():  # the shared traces beside the checkout are required, never skipped
        pytest.fail("the shared Mooncake trace is missing (../shared/traces)")
    table = {w.key: w for w in matrix.small_matrix()}
    out = {}
    for label in (*MET, RAG):
        key, load, cache = label.split("/")
        out[label] = matrix.run_cell(matrix.Cell(table[key], load, cache))
    return out


@pytest.mark.parametrize("label", MET)
def test_prefix_meets_every_target(cells: dict[str, dict[str, Any]], label: str) -> None:
    result = evaluate(cells[label])
    assert result["ok"], {name: check for name, check in result["checks"].items() if not check["ok"]}


def test_long_document_rag_keeps_its_hits_and_latency(cells: dict[str, dict[str, Any]]) -> None:
    checks = evaluate(cells[RAG])["checks"]
    assert checks["hit"]["value"] >= HIT_OF_ORACLE - 0.02
    assert checks["p50"]["ok"] and checks["p99"]["ok"] and checks["mean"]["ok"]


@pytest.mark.parametrize("label", (*MET, RAG))
def test_prefix_beats_every_load_only_policy_on_hits_and_mean_ttft(
    cells: dict[str, dict[str, Any]], label: str
) -> None:
    rows = cells[label]["report"]["policies"]
    prefix = rows["prefix"]
    for name in matrix.LOAD_ONLY:
        assert prefix["hit_rate"] >= rows[name]["hit_rate"], name
        assert prefix["ttft_ms"]["mean"] <= rows[name]["ttft_ms"]["mean"], name
