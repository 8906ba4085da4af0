"""PNG plots of a benchmark: TTFT CDF per policy, hit rate per policy, requests per worker; and the fair
peer run's TTFT mean and p99 per cell and router (``peer_matrix``).

Every title says whether the engines were simulated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _subplots(*args: Any, **kwargs: Any) -> Any:
    """``pyplot.subplots`` on the Agg backend. matplotlib is imported on the first plot, not with this
    module: the lab commands that never plot start without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def _close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _suffix(simulated: bool) -> str:
    return " (simulated engines)" if simulated else " (real engines)"


def ttft_cdf(ttfts_s: Mapping[str, Sequence[float]], path: Path, simulated: bool) -> Path:
    fig, ax = _subplots(figsize=(7, 4.5))
    for name, values in ttfts_s.items():
        ordered = sorted(v * 1000.0 for v in values)
        if ordered:
            ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
            ax.step(ordered, ys, where="post", label=name)
    ax.set_xscale("log")
    ax.set(
        xlabel="TTFT (ms, log scale)", ylabel="fraction of requests", title="TTFT CDF" + _suffix(simulated)
    )
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, path)


def hit_rates(policies: Mapping[str, Mapping[str, Any]], path: Path, simulated: bool) -> Path:
    names = list(policies)
    values = [(policies[n].get("hit_rate") or 0.0) * 100 for n in names]
    fig, ax = _subplots(figsize=(6, 4))
    bars = ax.bar(names, values, color="tab:blue")
    ax.bar_label(bars, fmt="%.1f%%")
    ax.set(ylabel="engine-reported prefix hit rate (%)", ylim=(0, 100), title="Hit rate" + _suffix(simulated))
    return _save(fig, path)


def requests_per_worker(policies: Mapping[str, Mapping[str, Any]], path: Path, simulated: bool) -> Path:
    names = list(policies)
    workers = sorted({w for n in names for w in policies[n].get("requests_per_worker", {})})
    fig, ax = _subplots(figsize=(max(6, len(names) * 1.6), 4))
    width = 0.8 / max(1, len(workers))
    for i, worker in enumerate(workers):
        xs = [p + i * width for p in range(len(names))]
        ax.bar(
            xs,
            [policies[n].get("requests_per_worker", {}).get(worker, 0) for n in names],
            width,
            label=worker,
        )
    ax.set_xticks([p + 0.4 - width / 2 for p in range(len(names))], names)
    ax.set(ylabel="requests", title="Requests per worker" + _suffix(simulated))
    if workers:
        ax.legend(fontsize="small")
    return _save(fig, path)


def write_all(
    document: Mapping[str, Any], ttfts_s: Mapping[str, Sequence[float]], directory: Path
) -> list[Path]:
    """The three plots under ``directory`` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    simulated = bool(document.get("simulated"))
    policies = document["policies"]
    return [
        ttft_cdf(ttfts_s, directory / "ttft_cdf.png", simulated),
        hit_rates(policies, directory / "hit_rate.png", simulated),
        requests_per_worker(policies, directory / "requests_per_worker.png", simulated),
    ]


def peer_matrix(matrix: Mapping[str, Any], path: Path) -> Path:
    """TTFT mean (top) and p99 (bottom) per cell (workload, load) and router, from a ``peer_matrix.build``
    document: one bar group per cell, one bar per router, in the order the routers first appear."""
    cells = matrix["cells"]
    routers = list(dict.fromkeys(label for cell in cells for label in cell["document"]["policies"]))
    names = [f"{cell['workload']}\n{cell['load']}" for cell in cells]
    fig, axes = _subplots(2, 1, figsize=(max(7, len(cells) * 1.9), 7.5), sharex=True)
    width = 0.8 / max(1, len(routers))
    for ax, stat in zip(axes, ("mean", "p99"), strict=True):
        for i, router in enumerate(routers):
            values = [_ttft(cell, router, stat) for cell in cells]
            ax.bar([c + i * width for c in range(len(cells))], values, width, label=router)
        ax.set(ylabel=f"TTFT {stat} (ms)")
        ax.grid(True, axis="y", alpha=0.3)
    axes[-1].set_xticks([c + 0.4 - width / 2 for c in range(len(cells))], names)
    axes[0].set_title("Fair peer run: TTFT per cell and router" + _suffix(bool(matrix.get("simulated"))))
    axes[0].legend(fontsize="small", ncol=2)
    return _save(fig, path)


def _ttft(cell: Mapping[str, Any], router: str, stat: str) -> float:
    summary = cell["document"]["policies"].get(router)
    value = summary["ttft_ms"].get(stat) if summary else None
    return float(value) if value is not None else 0.0


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _close(fig)
    return path
