from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefix_router.lab.bench import plots, table
from prefix_router.lab.bench.client import RequestRecord
from prefix_router.lab.bench.runner import RunResult
from prefix_router.lab.bench.summary import (
    SCHEMA_KEYS,
    distribution_ms,
    imbalance,
    quantile,
    report_document,
    summarize,
)


def _record(i: int, worker: str, ttft: float, ok: bool = True, cached: int | None = 50) -> RequestRecord:
    return RequestRecord(
        session_id=f"s{i}", turn=0, endpoint="chat", start_s=0.0, e2e_s=ttft * 2, ttft_s=ttft if ok else None,
        ok=ok, error=None if ok else "HTTP 500: boom", prompt_tokens=100, cached_tokens=cached,
        output_tokens=10, worker=worker, predicted_tokens=40,
    )  # fmt: skip


def _result(ttft: float, workers: tuple[str, ...] = ("a", "b")) -> RunResult:
    records = [_record(i, workers[i % len(workers)], ttft * (1 + i / 10)) for i in range(10)]
    records.append(_record(10, "a", 0.0, ok=False))
    return RunResult(records, wall_s=2.0)


def test_quantiles_and_distribution() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([5.0], 0.99) == 5.0
    d = distribution_ms([0.001 * i for i in range(1, 101)])
    assert (
        d["p50"] == pytest.approx(50.5)
        and d["p99"] == pytest.approx(99.01)
        and d["mean"] == pytest.approx(50.5)
    )
    assert distribution_ms([]) == {"p50": None, "p90": None, "p99": None, "mean": None}


def test_summary_follows_the_shared_schema() -> None:
    s = summarize(_result(0.1))
    assert set(SCHEMA_KEYS) <= set(s)
    assert s["requests"] == 11 and s["errors"] == 1
    assert s["hit_rate"] == 0.5 and s["predicted_hit_rate"] == 0.4
    assert s["prefill_tokens"] == 500 and s["throughput_rps"] == 5.0 and s["output_tokens_per_s"] == 50.0
    assert s["requests_per_worker"] == {"a": 6, "b": 5} and s["load_imbalance"] == pytest.approx(
        6 / 5.5, abs=1e-4
    )
    assert s["error_samples"] == ["HTTP 500: boom"]
    assert s["ttft_ms"]["p50"] == pytest.approx(145.0)


def test_hit_rate_is_none_without_engine_reports() -> None:
    records = [_record(i, "a", 0.1, cached=None) for i in range(3)]
    assert summarize(RunResult(records, 1.0))["hit_rate"] is None


def test_imbalance_counts_idle_workers() -> None:
    assert imbalance({"a": 8, "b": 0}) == 2.0
    assert imbalance({}) is None
    s = summarize(_result(0.1, ("a",)), per_worker={"a": 10, "b": 0, "c": 2})
    assert s["requests_per_worker"] == {"a": 10, "b": 0, "c": 2} and s["load_imbalance"] == 2.5


def _document() -> dict[str, object]:
    policies = {"random": summarize(_result(0.2)), "prefix": summarize(_result(0.05))}
    return report_document(policies, simulated=True, workload="mixed", workers=["a", "b"])


def test_document_is_json_and_names_the_baseline() -> None:
    doc = json.loads(json.dumps(_document()))
    assert doc["simulated"] is True and doc["baseline"] == "random"
    assert set(doc["policies"]) == {"random", "prefix"} and doc["oracle"] == {"hit_rate": None}
    other = report_document({"x": summarize(_result(0.1))}, simulated=False, workload="w", workers=[])
    assert other["baseline"] == "x" and other["simulated"] is False


def test_table_shows_ratios_against_random() -> None:
    doc = _document()
    rows = {r[0]: r for r in table.rows(doc)}
    assert rows["random"][-2] == "1.00x" and rows["prefix"][-2] == "4.00x"
    text = table.render(doc, console=table.Console(file=open("/dev/null", "w")))  # noqa: SIM115
    assert "SIMULATED" in text and "prefix" in text and "4.00x" in text


def test_plots_are_written(tmp_path: Path) -> None:
    doc = _document()
    ttfts = {"random": [0.2, 0.3, 0.25], "prefix": [0.05, 0.06]}
    paths = plots.write_all(doc, ttfts, tmp_path / "report")
    assert [p.name for p in paths] == ["ttft_cdf.png", "hit_rate.png", "requests_per_worker.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
