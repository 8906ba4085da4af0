"""The README's plot: hit rate and mean TTFT of ``prefix`` against ``random`` and the peers' ``cache_aware``
per setting, read from the results files that docs/benchmarks.md cites (nothing is run).

    .venv/bin/python benchmarks/plot_results.py [--out docs/img/prefix_vs_peers.png]

Settings, left to right: the Mooncake trace on 16 simulated engines (``benchmarks/results/mooncake16/``,
SGLang's algorithm emulated in the simulator); the fair peer run's six cells on 4 simulated engines
(``benchmarks/results/peers/one_run/``, sglang-router with TCP_NODELAY forced, vllm-router stock; no
``random`` row); the two cells on 3 real vLLM engines (``benchmarks/results/vllm_real/``). Every label says
whether its engines were simulated or real.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "img" / "prefix_vs_peers.png"
SERIES = ("random", "prefix", "sglang", "vllm-router")
COLORS = {"random": "tab:gray", "prefix": "tab:blue", "sglang": "tab:orange", "vllm-router": "tab:green"}
LEGEND = {
    "random": "prefix-router random",
    "prefix": "prefix-router prefix",
    "sglang": "SGLang cache_aware (sglang-router; emulated in the simulator)",
    "vllm-router": "vllm-router cache_aware",
}


@dataclass(frozen=True)
class Figure:
    """One router's figures in one setting: engine-reported hit rate (0-1) and mean TTFT in ms."""

    hit_rate: float
    ttft_mean_ms: float


@dataclass(frozen=True)
class Setting:
    """One group of bars: its label and the figures of each series measured there."""

    label: str
    figures: dict[str, Figure]


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


def mooncake(results: Path) -> Setting:
    """The simulator's Mooncake replay: ``random``, ``prefix`` and SGLang's algorithm, emulated."""
    policies = _read(results / "mooncake16" / "mooncake16.json")["policies"]
    names = {"random": "random", "prefix": "prefix", "sglang": "sglang_cache_aware"}
    figures = {
        series: Figure(policies[name]["hit_rate"], policies[name]["ttft_ms"]["mean"])
        for series, name in names.items()
    }
    return Setting("Mooncake trace,\n16 engines\n(SIMULATED)", figures)


def peer_cells(results: Path) -> list[Setting]:
    """The fair peer run, one setting per cell (workload and load), every router in one run."""
    names = {
        "prefix": "prefix-router prefix",
        "sglang": "sglang-router cache_aware +nodelay",
        "vllm-router": "vllm-router cache_aware stock",
    }
    settings = []
    for cell in _read(results / "peers" / "one_run" / "peers.json")["cells"]:
        policies = cell["document"]["policies"]
        figures = {
            series: Figure(policies[name]["hit_rate"], policies[name]["ttft_ms"]["mean"])
            for series, name in names.items()
        }
        settings.append(Setting(f"peers: {cell['workload']}\n{cell['load']}\n(SIMULATED)", figures))
    return settings


def vllm_cell(results: Path, folder: str, label: str) -> Setting:
    """One cell of the real-vLLM run (``vllm_real.py``'s ``runs.json``)."""
    names = {
        "prefix-router random": "random",
        "prefix-router prefix": "prefix",
        "sglang-router cache_aware": "sglang",
        "vllm-router cache_aware": "vllm-router",
    }
    figures = {
        names[run["router"]]: Figure(run["engine_hit_rate"], run["ttft_ms"]["mean"])
        for run in _read(results / "vllm_real" / folder / "runs.json")
        if run["router"] in names
    }
    return Setting(label, figures)


def settings(results: Path = RESULTS) -> list[Setting]:
    """Every setting of the plot, in its order."""
    return [
        mooncake(results),
        *peer_cells(results),
        vllm_cell(results, "shared_3engines", "vLLM x3,\nshared prompts\n(real)"),
        vllm_cell(results, "interleaved13_3engines", "vLLM x3,\n13 conversations\n(real)"),
    ]


def _bars(ax: Any, groups: Sequence[Setting], value: str) -> None:
    width = 0.8 / len(SERIES)
    for k, series in enumerate(SERIES):
        xs = [i + (k - (len(SERIES) - 1) / 2) * width for i, g in enumerate(groups) if series in g.figures]
        ys = [_value(g.figures[series], value) for g in groups if series in g.figures]
        ax.bar(xs, ys, width, color=COLORS[series], label=LEGEND[series])


def _value(figure: Figure, value: str) -> float:
    return figure.hit_rate * 100 if value == "hit" else figure.ttft_mean_ms


def plot(groups: Sequence[Setting], out: Path) -> Path:
    """Two panels over the same settings: hit rate (%) and mean TTFT (ms, log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (hit, ttft) = plt.subplots(2, 1, figsize=(13, 7.5), sharex=True)
    _bars(hit, groups, "hit")
    _bars(ttft, groups, "ttft")
    hit.set(ylabel="engine-reported hit rate (%)", ylim=(0, 100))
    ttft.set(ylabel="TTFT mean (ms, log scale)", yscale="log")
    ttft.set_xticks(range(len(groups)), [g.label for g in groups], fontsize=8)
    for ax in (hit, ttft):
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("prefix vs random vs the peers, per setting (simulated or real engines, as labelled)")
    handles, labels = hit.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(SERIES), fontsize=8, bbox_to_anchor=(0.5, 0.955))
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=OUT, help="the PNG to write")
    args = parser.parse_args(argv)
    print(plot(settings(), args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
