"""The policy matrix as one PNG (simulated): per cell and policy, the hit rate as a share of the pooled
oracle's and the mean TTFT relative to the best policy of the cell."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_MARKERS = "os^v<>Dpx*"


def plot_matrix(document: Mapping[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells: Sequence[Mapping[str, Any]] = document["cells"]
    labels = [f"{c['workload']}\n{c['load']}/{c['cache']}" for c in cells]
    policies = list(cells[0]["report"]["policies"]) if cells else []
    fig, (hits, ttft) = plt.subplots(2, 1, figsize=(max(12, len(cells) * 0.55), 9), sharex=True)
    xs = range(len(cells))
    for i, policy in enumerate(policies):
        style = {"marker": _MARKERS[i % len(_MARKERS)], "linestyle": "", "label": policy}
        if policy == "prefix":
            style.update(markersize=9, color="black")
        hits.plot(xs, [_of_oracle(c, policy) for c in cells], **style)
        ttft.plot(xs, [_relative_mean(c, policy) for c in cells], **style)
    hits.axhline(0.97, color="grey", linestyle="--", linewidth=0.8)
    hits.set_ylabel("hit rate / pooled oracle")
    hits.legend(fontsize="small", ncol=4)
    ttft.set_yscale("log")
    ttft.set_ylabel("mean TTFT / best policy's (log)")
    ttft.set_xticks(list(xs), labels, rotation=90, fontsize="small")
    fig.suptitle("Policy matrix (SIMULATED engines): hit rate vs the pooled-cache oracle, mean TTFT")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _of_oracle(cell: Mapping[str, Any], policy: str) -> float:
    oracle = cell["report"]["oracle"]["hit_rate"]
    hit = cell["report"]["policies"].get(policy, {}).get("hit_rate", float("nan"))
    return float(hit / oracle) if oracle else float("nan")


def _relative_mean(cell: Mapping[str, Any], policy: str) -> float:
    rows = cell["report"]["policies"]
    best = min(r["ttft_ms"]["mean"] for r in rows.values())
    row = rows.get(policy)
    return float(row["ttft_ms"]["mean"] / best) if row and best > 0 else float("nan")
