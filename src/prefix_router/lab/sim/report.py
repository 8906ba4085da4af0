"""Presenting a ``simulate`` report: a rich table and a PNG, both labelled as simulated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def title(report: dict[str, Any]) -> str:
    return (
        f"SIMULATED: {report['source']} on {report['instances']} x {report['profile']} "
        f"({report['capacity_tokens_per_instance']:,} KV tokens each, seed {report['seed']})"
    )


COLUMNS = (
    "policy", "requests", "errors", "hit", "/oracle", "x random", "predicted",
    "TTFT mean", "p50", "p90", "p99", "queue p50", "p99 ", "busy", "prefill",
    "e2e p50", "req/s", "prefill Mtok", "copies", "imbalance",
)  # fmt: skip


def table(report: dict[str, Any]) -> Table:
    caption = (
        "simulated engines (prefix-router simulate); not measurements. Times in ms; queue: engine wait "
        "before admission; busy: mean fraction of the run an engine was stepping; prefill: share of that "
        "time in steps computing prompt tokens; copies: cached block copies per distinct cached block"
    )
    out = Table(title=title(report), caption=caption)
    for name in COLUMNS:
        out.add_column(name, justify="left" if name == "policy" else "right")
    oracle = report["oracle"]["hit_rate"]
    baseline = report["policies"].get("random", {}).get("hit_rate")
    details = report.get("details", {})
    for policy, row in report["policies"].items():
        out.add_row(policy, *_cells(row, details.get(policy, {}), oracle, baseline))
    out.add_row("oracle (pooled cache)", "", "", f"{oracle:.1%}", "100%", *[""] * (len(COLUMNS) - 5))
    return out


def _cells(row: dict[str, Any], extra: dict[str, Any], oracle: float, baseline: float | None) -> list[str]:
    hit = row["hit_rate"]
    ttft = row["ttft_ms"]
    queue = extra.get("queue_wait_ms", {})
    use = extra.get("utilisation", {})
    copies = extra.get("replication", {}).get("mean")
    return [
        f"{row['requests']:,}",
        str(row["errors"]),
        f"{hit:.1%}",
        f"{hit / oracle:.0%}" if oracle else "-",
        f"{hit / baseline:.2f}" if baseline else "-",
        f"{row['predicted_hit_rate']:.1%}",
        f"{ttft['mean']:.0f}",
        f"{ttft['p50']:.0f}",
        f"{ttft['p90']:.0f}",
        f"{ttft['p99']:.0f}",
        f"{queue['p50']:.0f}" if queue else "-",
        f"{queue['p99']:.0f}" if queue else "-",
        f"{use['busy_fraction']:.0%}" if use else "-",
        f"{use['prefill_share']:.0%}" if use else "-",
        f"{row['e2e_ms']['p50']:.0f}",
        f"{row['throughput_rps']:.2f}",
        f"{row['prefill_tokens'] / 1e6:.1f}",
        f"{copies:.2f}" if copies else "-",
        f"{row['load_imbalance']:.2f}",
    ]


def print_report(report: dict[str, Any], console: Console) -> None:
    console.print(table(report))
    ideal = report["oracle"].get("ideal_hit_rate")
    if ideal is not None:
        console.print(f"unbounded-cache reuse in these requests (simulated replay): {ideal:.1%}")


def plot(report: dict[str, Any], path: str | Path) -> None:
    """Four panels: hit rates (with the oracle), TTFT, prefill work and load imbalance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(report["policies"])
    rows = [report["policies"][p] for p in policies]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    _hit_panel(axes[0][0], policies, rows, report["oracle"]["hit_rate"])
    _ttft_panel(axes[0][1], policies, rows)
    _bar(axes[1][0], policies, [r["prefill_tokens"] / 1e6 for r in rows], "prefill tokens computed (M)")
    _bar(axes[1][1], policies, [r["load_imbalance"] for r in rows], "load imbalance (max / mean requests)")
    fig.suptitle(title(report) + "\n(simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _hit_panel(ax: Any, policies: list[str], rows: list[dict[str, Any]], oracle: float) -> None:
    xs = range(len(policies))
    ax.bar([x - 0.2 for x in xs], [r["hit_rate"] for r in rows], 0.4, label="engine-reported")
    ax.bar([x + 0.2 for x in xs], [r["predicted_hit_rate"] for r in rows], 0.4, label="router-predicted")
    ax.axhline(oracle, color="black", linestyle="--", label="oracle (pooled cache)")
    ax.set_xticks(list(xs), policies, rotation=20)
    ax.set_title("prefix-cache hit rate (cached / prompt tokens)")
    ax.legend(fontsize="small")


def _ttft_panel(ax: Any, policies: list[str], rows: list[dict[str, Any]]) -> None:
    xs = range(len(policies))
    for offset, key in ((-0.27, "p50"), (0.0, "p90"), (0.27, "p99")):
        ax.bar([x + offset for x in xs], [r["ttft_ms"][key] for r in rows], 0.27, label=key)
    ax.set_xticks(list(xs), policies, rotation=20)
    ax.set_yscale("log")
    ax.set_title("time to first token (ms, log scale)")
    ax.legend(fontsize="small")


def _bar(ax: Any, policies: list[str], values: list[float], label: str) -> None:
    ax.bar(policies, values)
    ax.tick_params(axis="x", rotation=20)
    ax.set_title(label)
