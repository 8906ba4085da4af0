"""The concurrency sweep's outputs (SIMULATED): the text tables with the targets, and the plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefix_router.lab.sim.sweep import (
    EMULATED_PEERS,
    HIT_SLACK,
    LOAD_ONLY,
    MEAN_ALLOWANCE,
    SWEEP_RATIO_TARGET,
    evaluate,
    summary,
)

_MARKERS = "os^v<>Dpx*PhH"


def cell_label(cell: Mapping[str, Any]) -> str:
    rate = f", {cell['rate_rps']:.2f} req/s" if cell["rate_rps"] is not None else ""
    return (
        f"{cell['engines']} engines x {cell['profile']}, {cell['cache']} cache, {cell['arrivals']} "
        f"@ {cell['concurrency']} in flight{rate}"
    )


def _ci(measure: Mapping[str, float], scale: float, digits: int) -> str:
    return (
        f"{measure['mean'] * scale:,.{digits}f} "
        f"[{measure['low'] * scale:,.{digits}f}, {measure['high'] * scale:,.{digits}f}]"
    )


def cell_text(cell: Mapping[str, Any], judged: str) -> list[str]:
    """One cell: a row per policy (means over the seeds, 95 % intervals), then the judged policy's targets."""
    lines = [cell_label(cell)]
    lines.append(
        f"  {'policy':20s} {'hit % [95% CI]':>24s} {'TTFT mean ms [95% CI]':>28s} {'p99 ms':>9s} imbal. "
        "predicted TTFT error (median)"
    )
    for policy, row in cell["policies"].items():
        mark = "*" if policy == judged else " "
        error = row.get("predicted_ttft_mdape")
        lines.append(
            f" {mark}{policy:20s} {_ci(row['hit_rate'], 100, 1):>24s} {_ci(row['ttft_mean_ms'], 1, 0):>28s} "
            f"{row['ttft_p99_ms']['mean']:9,.0f} {row['imbalance']['mean']:.2f}"
            + (f"   {error['mean'] * 100:.0f} %" if error else "")
        )
    if judged in cell["policies"]:
        lines.append("  " + verdict_line(evaluate(cell, judged)["checks"]))
    return lines


def verdict_line(checks: Mapping[str, Mapping[str, Any]]) -> str:
    parts = []
    names = {"hit": "hit", "mean": "TTFT mean", "p99": "p99", "ratio": "vs best peer"}
    for key in ("hit", "mean", "p99", "ratio"):
        if key in checks:
            check = checks[key]
            value = f"{check['value']:.3f}" if key in ("hit", "ratio") else f"{check['value']:,.0f}"
            bound = f"{check['bound']:.3f}" if key in ("hit", "ratio") else f"{check['bound']:,.0f}"
            parts.append(f"{names[key]} {value} (bound {bound}) {'ok' if check['ok'] else 'MISSED'}")
    return "targets: " + "; ".join(parts)


def glance_line(cell: Mapping[str, Any], judged: str) -> str:
    """One line per cell: the judged policy's hit rate and TTFT mean against the best emulated peer's and
    the best policy's, and which targets hold."""
    rows = cell["policies"]
    own = rows[judged]
    peers = {p: rows[p] for p in EMULATED_PEERS if p in rows and p != judged}
    best = min(rows, key=lambda p: rows[p]["ttft_mean_ms"]["mean"])
    where = f"{cell['engines']} x {cell['profile']:3s} {cell['cache']:8s} {cell['arrivals']:6s}"
    text = f"{where} @{cell['concurrency']:2d}  hit {own['hit_rate']['mean'] * 100:5.1f} %"
    if peers:
        peer_hit = max(r["hit_rate"]["mean"] for r in peers.values())
        peer_ttft = min(r["ttft_mean_ms"]["mean"] for r in peers.values())
        ttft = own["ttft_mean_ms"]["mean"]
        text += f" (peer {peer_hit * 100:5.1f})  TTFT {ttft:7,.0f} ms (peer {peer_ttft:7,.0f})"
    text += f"  best {best} {rows[best]['ttft_mean_ms']['mean']:,.0f} ms"
    checks = evaluate(cell, judged)["checks"]
    marks = " ".join(
        f"{k}:{'ok' if checks[k]['ok'] else 'NO'}" for k in ("hit", "mean", "p99") if k in checks
    )
    return f"{text}  [{marks}]"


def summary_text(cells: Sequence[Mapping[str, Any]], judged: str) -> list[str]:
    s = summary(cells, judged)
    met = s["met"]
    n = s["cells"]
    lines = [
        f"SUMMARY for {judged} over {n} cells (SIMULATED):",
        f"  hit >= best emulated peer ({', '.join(EMULATED_PEERS)}) - {HIT_SLACK * 100:.0f} point: "
        f"{met['hit']}/{n}",
        f"  TTFT mean <= every other policy's x {1 + MEAN_ALLOWANCE:.2f}: {met['mean']}/{n}",
        f"  TTFT p99 <= best load-only policy's ({', '.join(LOAD_ONLY)}): {met['p99']}/{n}",
        f"  all three: {s['all_met']}/{n}",
        f"  geometric mean of TTFT mean / best emulated peer's: {s['ttft_ratio_geomean']:.3f} "
        f"(target <= {SWEEP_RATIO_TARGET:.2f}: {'ok' if s['ttft_ratio_ok'] else 'MISSED'})",
    ]
    errors = [
        c["policies"][judged]["predicted_ttft_mdape"]["mean"]
        for c in cells
        if c["policies"].get(judged, {}).get("predicted_ttft_mdape")
    ]
    if errors:
        ranked = sorted(errors)
        middle = ranked[len(ranked) // 2]
        lines.append(
            f"  predicted TTFT, median relative error per cell: median {middle * 100:.0f} %, "
            f"range {ranked[0] * 100:.0f}-{ranked[-1] * 100:.0f} %"
        )
    for key, values in _slices(cells).items():
        part = summary(values, judged)
        lines.append(
            f"  {key:10s} {part['all_met']:3d}/{part['cells']:<3d} all met, "
            f"geomean vs best peer {part['ttft_ratio_geomean']:.3f}"
        )
    return lines


def _slices(cells: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for field in ("arrivals", "profile", "cache", "engines"):
        for cell in sorted(cells, key=lambda c: c[field]):
            key = f"{cell[field]} engines" if field == "engines" else str(cell[field])
            out.setdefault(key, []).append(cell)
    return out


def text(document: Mapping[str, Any]) -> str:
    """The whole results file: the header, every cell, the summary."""
    judged = document["judged"]
    lines = list(document["header"])
    for cell in document["cells"]:
        lines += ["", *cell_text(cell, judged)]
    lines += ["", f"AT A GLANCE ({judged}; peer = the best emulated peer's hit rate and TTFT mean):"]
    lines += [glance_line(cell, judged) for cell in document["cells"] if judged in cell["policies"]]
    lines += ["", *summary_text(document["cells"], judged)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- plot


def plot(document: Mapping[str, Any], path: str | Path, arrivals: str) -> None:
    """Hit rate and TTFT mean (with 95 % intervals) against concurrency, one line per policy; a panel
    pair per fleet (columns) and per profile and cache (rows), for one arrival process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in document["cells"] if c["arrivals"] == arrivals]
    rows = sorted({(c["profile"], c["cache"]) for c in cells})
    fleets = sorted({c["engines"] for c in cells})
    if not cells:
        return
    policies = list(cells[0]["policies"])
    fig, axes = plt.subplots(
        len(rows), 2 * len(fleets), figsize=(4 * len(fleets) * 2, 3 * len(rows)), squeeze=False
    )
    for r, (profile, cache) in enumerate(rows):
        for f, engines in enumerate(fleets):
            here = sorted(
                (c for c in cells if (c["profile"], c["cache"], c["engines"]) == (profile, cache, engines)),
                key=lambda c: c["concurrency"],
            )
            hit_ax, ttft_ax = axes[r][2 * f], axes[r][2 * f + 1]
            for i, policy in enumerate(policies):
                _line(hit_ax, here, policy, "hit_rate", 100.0, i, document["judged"])
                _line(ttft_ax, here, policy, "ttft_mean_ms", 1.0, i, document["judged"])
            hit_ax.set_title(f"{engines} x {profile}, {cache}: hit %", fontsize="small")
            ttft_ax.set_title(f"{engines} x {profile}, {cache}: TTFT mean ms", fontsize="small")
            ttft_ax.set_yscale("log")
            hit_ax.set_ylim(0, 100)
            for ax in (hit_ax, ttft_ax):
                ax.set_xscale("log", base=2)
                ax.set_xticks([c["concurrency"] for c in here], [str(c["concurrency"]) for c in here])
                ax.set_xlabel("requests in flight", fontsize="small")
    axes[0][0].legend(fontsize="x-small", ncol=2)
    fig.suptitle(f"Concurrency sweep, {arrivals} arrivals (SIMULATED engines; 95 % intervals over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=60)
    plt.close(fig)


def _line(
    ax: Any, cells: Sequence[Mapping[str, Any]], policy: str, key: str, scale: float, i: int, judged: str
) -> None:
    xs = [c["concurrency"] for c in cells]
    measures = [c["policies"][policy][key] for c in cells]
    ys = [m["mean"] * scale for m in measures]
    low = [(m["mean"] - m["low"]) * scale for m in measures]
    high = [(m["high"] - m["mean"]) * scale for m in measures]
    style: dict[str, Any] = {
        "marker": _MARKERS[i % len(_MARKERS)],
        "markersize": 3,
        "linewidth": 1,
        "label": policy,
    }
    if policy == judged:
        style.update(color="black", linewidth=2, markersize=5)
    ax.errorbar(xs, ys, yerr=[low, high], capsize=2, **style)
