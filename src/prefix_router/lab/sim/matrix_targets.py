"""The targets of the policy matrix, checked per cell, and the matrix as markdown tables (simulated).

Per cell, for the ``prefix`` policy:
- ``hit``: engine hit rate >= 97 % of the pooled-cache oracle's;
- ``p50`` / ``p99``: TTFT no worse than the best load-only policy (random, round_robin, least_load,
  power_of_two), within ``TOLERANCE``;
- ``mean``: mean TTFT no worse than ``sglang_cache_aware``'s, within ``TOLERANCE``;
- ``imbalance``: max / mean requests per instance <= 1.2 once the fleet is hot (hot and overload).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prefix_router.lab.sim.matrix import LOAD_ONLY

HIT_OF_ORACLE = 0.97
TOLERANCE = 0.02  # relative slack on the latency comparisons (the simulator is deterministic)
MAX_IMBALANCE = 1.2
POLICY = "prefix"


def _check(value: float, bound: float, ok: bool) -> dict[str, Any]:
    return {"value": value, "bound": bound, "ok": ok}


def evaluate(cell: Mapping[str, Any], policy: str = POLICY) -> dict[str, Any]:
    """The targets of ``policy`` in one matrix cell (``run_cell``'s output)."""
    rows = cell["report"]["policies"]
    oracle = cell["report"]["oracle"]["hit_rate"]
    row = rows[policy]
    ttft = row["ttft_ms"]
    checks: dict[str, dict[str, Any]] = {}
    of_oracle = row["hit_rate"] / oracle if oracle else 1.0
    checks["hit"] = _check(of_oracle, HIT_OF_ORACLE, of_oracle >= HIT_OF_ORACLE)
    load_only = [rows[p] for p in LOAD_ONLY if p in rows]
    for key in ("p50", "p99"):
        if load_only:
            best = min(r["ttft_ms"][key] for r in load_only)
            checks[key] = _check(ttft[key], best, ttft[key] <= best * (1 + TOLERANCE))
    if "sglang_cache_aware" in rows:
        peer = rows["sglang_cache_aware"]["ttft_ms"]["mean"]
        checks["mean"] = _check(ttft["mean"], peer, ttft["mean"] <= peer * (1 + TOLERANCE))
    if cell["load"] != "cold":
        imbalance = row["load_imbalance"]
        checks["imbalance"] = _check(imbalance, MAX_IMBALANCE, imbalance <= MAX_IMBALANCE)
    return {"checks": checks, "ok": all(c["ok"] for c in checks.values())}


def failures(cells: Iterable[Mapping[str, Any]], policy: str = POLICY) -> list[str]:
    """``workload/load/cache: check value (bound)`` for every target missed."""
    out = []
    for cell in cells:
        for name, check in evaluate(cell, policy)["checks"].items():
            if not check["ok"]:
                label = f"{cell['workload']}/{cell['load']}/{cell['cache']}"
                out.append(f"{label}: {name} {check['value']:.3g} (bound {check['bound']:.3g})")
    return out


# ---------------------------------------------------------------------------------------------- markdown

_HEAD = (
    "| policy | hit | of oracle | TTFT mean ms | p50 | p99 | prefill Mtok | imbalance | busy | queue p99 ms "
    "| copies |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def cell_table(cell: Mapping[str, Any]) -> str:
    report = cell["report"]
    oracle = report["oracle"]["hit_rate"]
    lines = [_HEAD]
    for policy, row in report["policies"].items():
        extra = report["details"][policy]
        ttft = row["ttft_ms"]
        of_oracle = f"{row['hit_rate'] / oracle:.0%}" if oracle else "-"
        name = f"**{policy}**" if policy == POLICY else policy
        lines.append(
            f"| {name} | {row['hit_rate']:.1%} | {of_oracle} | {ttft['mean']:,.0f} | {ttft['p50']:,.0f} "
            f"| {ttft['p99']:,.0f} | {row['prefill_tokens'] / 1e6:.2f} | {row['load_imbalance']:.2f} "
            f"| {extra['utilisation']['busy_fraction']:.0%} | {extra['queue_wait_ms']['p99']:,.0f} "
            f"| {extra['replication']['mean']:.2f} |"
        )
    lines.append(f"| oracle (pooled cache) | {oracle:.1%} | 100% | | | | | | | | |")
    return "\n".join(lines)


def summary_table(cells: Iterable[Mapping[str, Any]], policy: str = POLICY) -> str:
    lines = [
        "| cell | hit / oracle | TTFT p50 vs best load-only | p99 vs best load-only | mean vs sglang "
        "| imbalance | all met |",
        "|---|---:|---:|---:|---:|---:|:---:|",
    ]
    for cell in cells:
        checks = evaluate(cell, policy)["checks"]
        lines.append(
            f"| {cell['workload']}/{cell['load']}/{cell['cache']} | {_pct(checks['hit'])} "
            f"| {_ms(checks.get('p50'))} | {_ms(checks.get('p99'))} | {_ms(checks.get('mean'))} "
            f"| {_ratio(checks.get('imbalance'))} | {_all(checks)} |"
        )
    return "\n".join(lines)


def _all(checks: Mapping[str, Mapping[str, Any]]) -> str:
    return "yes" if all(c["ok"] for c in checks.values()) else "NO"


def _mark(check: Mapping[str, Any]) -> str:
    return "" if check["ok"] else " ✗"


def _pct(check: Mapping[str, Any]) -> str:
    return f"{check['value']:.1%}{_mark(check)}"


def _ms(check: Mapping[str, Any] | None) -> str:
    if check is None:
        return "-"
    return f"{check['value']:,.0f} / {check['bound']:,.0f}{_mark(check)}"


def _ratio(check: Mapping[str, Any] | None) -> str:
    return "-" if check is None else f"{check['value']:.2f}{_mark(check)}"


def markdown(document: Mapping[str, Any]) -> str:
    """The whole matrix: the targets summary, then one table per cell."""
    cells = document["cells"]
    parts = ["### Targets (prefix, per cell)", "", summary_table(cells), ""]
    for cell in cells:
        report = cell["report"]
        parts += [
            f"### {cell['workload']} / {cell['load']} / {cell['cache']} cache",
            "",
            f"{cell['description']}; {report['instances']} x {report['profile']}, "
            f"{report['capacity_tokens_per_instance']:,} KV tokens each, rate x{report['rate_scale']}, "
            f"{cell['requests']:,} requests (SIMULATED).",
            "",
            cell_table(cell),
            "",
        ]
    return "\n".join(parts)
