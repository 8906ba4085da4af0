"""The comparison table printed after a benchmark: one row per policy, ratios against the baseline."""

from __future__ import annotations

import io
import sys
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

_COLUMNS = (
    "policy", "reqs", "errs", "hit rate", "TTFT p50", "TTFT p90", "TTFT p99",
    "e2e p50", "req/s", "tok/s", "imbal.", "tok imbal.", "TTFT p50 gain", "req/s ratio",
)  # fmt: skip
WIDTH = 160  # when the output is not a terminal (a terminal's own width is used)


CAPTION = (
    "times in ms; hit rate = engine-reported cached / prompt tokens; imbal. = max/mean requests per worker "
    "(* by prompt tokens from engine metrics); tok imbal. = max/mean prompt tokens sent per engine; "
    "TTFT p50 gain = baseline TTFT p50 / policy TTFT p50 (2.00x = half); req/s ratio = policy / baseline"
)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def _fmt(value: Any, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def rows(document: Mapping[str, Any]) -> list[list[str]]:
    """Formatted rows; gain = baseline TTFT p50 / policy TTFT p50 (2.00x: half the TTFT)."""
    policies = document["policies"]
    base = policies.get(document.get("baseline") or "", {})
    return [row(name, summary, base) for name, summary in policies.items()]


def row(name: str, s: Mapping[str, Any], base: Mapping[str, Any]) -> list[str]:
    hit, ttft = s.get("hit_rate"), s["ttft_ms"]
    return [
        name, _fmt(s["requests"]), _fmt(s["errors"]), "-" if hit is None else f"{hit * 100:.1f}%",
        _fmt(ttft["p50"]), _fmt(ttft["p90"]), _fmt(ttft["p99"]), _fmt(s["e2e_ms"]["p50"]),
        _fmt(s["throughput_rps"], 2), _fmt(s.get("output_tokens_per_s"), 0), _imbalance(s),
        _fmt(s.get("load_imbalance_tokens"), 2),
        _fmt(ratio(base.get("ttft_ms", {}).get("p50"), ttft["p50"]), 2, "x"),
        _fmt(ratio(s["throughput_rps"], base.get("throughput_rps")), 2, "x"),
    ]  # fmt: skip


def _imbalance(summary: Mapping[str, Any]) -> str:
    """max/mean per worker; starred when judged by prompt tokens (the router did not name the worker)."""
    text = _fmt(summary["load_imbalance"], 2)
    return text + "*" if summary.get("load_imbalance_basis", "requests") != "requests" else text


def output_console() -> Console:
    """stdout, at the terminal's width, or ``WIDTH`` columns when piped."""
    return Console() if sys.stdout.isatty() else Console(width=WIDTH)


def title(document: Mapping[str, Any]) -> str:
    engines = "SIMULATED engines" if document.get("simulated") else "real engines"
    workers = len(document.get("workers", ()))
    baseline = document.get("baseline")
    return f"workload {document.get('workload')} - {workers} workers ({engines}) - baseline {baseline}"


def render(document: Mapping[str, Any], console: Console | None = None) -> str:
    """Print the table (and return it as plain text)."""
    table = Table(title=title(document), caption=CAPTION)
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in rows(document):
        table.add_row(*row)
    target = console or output_console()
    target.print(table)
    recorder = Console(record=True, width=WIDTH, file=io.StringIO())
    recorder.print(table)
    return recorder.export_text()
