"""Prefill/decode disaggregation against colocated serving in the simulator (SIMULATED engines, Llama-3.1-8B
on H100 profile): xPyD ratios at 16-64 engines, and the decider's threshold on a multi-turn workload.

Part 1, the xPyD sweep: per engine count N and load (requests per second per engine), the colocated
fleet (N engines of role ``both``, the prefix policy) against disaggregated fleets of the same N engines
split P:D (``--splits``, the prefill share of N), every fleet routed by the routing core (``Router.route``
colocated, ``Router.route_pd`` disaggregated: the prefix policy in both stages, the default decider),
over the same requests. The decode stage is charged to the router (its load and prediction) at the
two-stage choice, as the edge does: the decode worker reserved while the prefill runs (dispatched only
after it, the requests arriving meanwhile did not see it coming and herded onto the decode worker that
looked idle). ``TTFT p99`` and ``TPOT p99``
(time per output token after the first: the decode's inter-token latency) are printed with their
ratio to colocated; ``P/D wins`` marks the cells where the disaggregated fleet's TPOT p99 and TTFT
mean are both below colocated's, and the target line checks that TTFT p99 is not worse there either.

Part 2, the decider: on the multi-turn workload, per threshold (``skip_prefill_tokens``), the turns whose
prompt the chosen decode engine held (all but the threshold, engine truth at routing time) and the share
of them that skipped the prefill stage, the cold turns (no engine held a block of them) and how many
skipped (must be 0), against the colocated TTFT.

    python benchmarks/pd_sim.py --workloads long-prompts --loads 2,4,6 --splits 0.5,0.75 --skip-decider \
        --out benchmarks/results/pd_sim_long_at_choice.txt --plot docs/img/pd_sim_long_at_choice.png
    python benchmarks/pd_sim.py --workloads long-prompts --engines 16,32 --loads 2,4,6 --splits 0.25 \
        --skip-decider --out benchmarks/results/pd_sim_long_quarter.txt
    python benchmarks/pd_sim.py --workloads mixed --engines 16,64 --loads 2,4 --splits 0.25,0.5 \
        --out benchmarks/results/pd_sim_mixed.txt --plot docs/img/pd_sim_mixed.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefix_router.lab.sim.pd_sim import PdSpec
from prefix_router.lab.sim.profiles import get_profile
from prefix_router.lab.sim.run import Scenario, workload_scenario
from prefix_router.lab.sim.simulator import ClusterSimulation, ClusterSpec
from prefix_router.lab.sim.stats import details, summarize

PROFILE = "llama-3.1-8b-h100"
WORKLOAD_RATE = 8.0  # requests/s of the workloads' default Poisson arrivals (rate_scale multiplies it)
SWEEP_WORKLOADS = {
    # long prompts, no reuse, long answers: where prefill and decode interfere most
    "long-prompts": ("unique", {"prompt_tokens": 4096, "output_tokens": 256}),
    # tenants' shared system prompts and multi-turn conversations: most prompts are cached somewhere
    "mixed": ("mixed", {"output_tokens": 128, "max_output_tokens": 256}),
}


@dataclass(frozen=True)
class Row:
    workload: str
    engines: int
    load: float  # requests/s per engine
    fleet: str  # "colocated" or "xPyD"
    summary: dict[str, Any]
    detail: dict[str, Any]
    pd: dict[str, Any] | None

    def ttft(self, key: str) -> float:
        return float(self.summary["ttft_ms"][key])

    def tpot(self, key: str) -> float:
        return float(self.detail["tpot_ms"][key])


def scenario(workload: str, engines: int, load: float, requests: int, seed: int) -> Scenario:
    name, options = SWEEP_WORKLOADS.get(workload, (workload, {}))
    profile = get_profile(PROFILE)
    spec = ClusterSpec(engines, profile, profile.kv_capacity_tokens, seed)
    rate_scale = load * engines / WORKLOAD_RATE
    return workload_scenario(name, spec, rate_scale=rate_scale, limit=requests, options=dict(options))


def run(sc: Scenario, pd: PdSpec | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    sim = ClusterSimulation(sc.spec, "prefix", sc.make_source(), sc.routing("prefix"), pd=pd)
    result = sim.run()
    pd_summary = dict(result.pd) if result.pd is not None else None
    return summarize(result.stats), details(result.stats, result.wall_s), pd_summary


def sweep(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    for workload in args.workloads.split(","):
        for engines in (int(n) for n in args.engines.split(",")):
            for load in (float(x) for x in args.loads.split(",")):
                sc = scenario(workload, engines, load, args.requests_per_engine * engines, args.seed)
                rows.append(Row(workload, engines, load, "colocated", *run(sc, None)))
                for share in (float(s) for s in args.splits.split(",")):
                    prefill = max(1, min(engines - 1, round(engines * share)))
                    pd = PdSpec.split(prefill, engines - prefill)
                    label = f"{prefill}P{engines - prefill}D"
                    rows.append(Row(workload, engines, load, label, *run(sc, pd)))
                    print(f"# {workload} {engines} engines {load}/s/engine {label} done", file=sys.stderr)
    return rows


def sweep_table(rows: list[Row]) -> list[str]:
    lines = [
        "## xPyD against colocated (SIMULATED: llama-3.1-8b-h100 profile, prefix policy in every stage; "
        "decode charged at the choice)",
        "",
        "| workload | engines | load/engine | fleet | TTFT mean ms | TTFT p99 ms | x colo | TPOT p99 ms "
        "| x colo | prompt-cache hit | prefills | P/D wins |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base: Row | None = None
    for row in rows:
        if row.fleet == "colocated":
            base = row
        assert base is not None
        wins = row.fleet != "colocated" and _wins(row, base)
        prefills = "" if row.pd is None else str(row.pd["prefills"])
        hit = row.summary["hit_rate"] if row.pd is None else row.pd["prefill_hit_rate"]
        lines.append(
            f"| {row.workload} | {row.engines} | {row.load:g} | {row.fleet} | {row.ttft('mean'):.0f} "
            f"| {row.ttft('p99'):.0f} | {row.ttft('p99') / base.ttft('p99'):.2f} | {row.tpot('p99'):.1f} "
            f"| {row.tpot('p99') / base.tpot('p99'):.2f} | {hit:.3f} | {prefills} "
            f"| {'yes' if wins else ''} |"
        )
    return lines


def _wins(row: Row, base: Row) -> bool:
    return row.tpot("p99") < base.tpot("p99") and row.ttft("mean") < base.ttft("mean")


def target_lines(rows: list[Row]) -> list[str]:
    """The target: where P/D wins (TPOT p99 and TTFT mean below colocated), its TTFT p99 is not worse."""
    wins, worse = 0, []
    base: Row | None = None
    for row in rows:
        if row.fleet == "colocated":
            base = row
            continue
        assert base is not None
        if _wins(row, base):
            wins += 1
            if row.ttft("p99") > base.ttft("p99"):
                worse.append(f"{row.workload} {row.engines} {row.load:g}/s {row.fleet}")
    verdict = "MET" if not worse else "NOT MET: " + "; ".join(worse)
    return [f"target: P/D TTFT p99 <= colocated wherever P/D wins ({wins} winning cells): {verdict}"]


def decider(args: argparse.Namespace) -> list[str]:
    engines = args.decider_engines
    prefill = engines // 4
    sc = scenario("multi-turn", engines, args.decider_load, args.decider_requests, args.seed)
    colocated, _, _ = run(sc, None)
    lines = [
        f"## The decider on multi-turn (SIMULATED: {engines} engines, {prefill}P{engines - prefill}D, "
        f"{args.decider_load:g} requests/s per engine, {args.decider_requests} turns)",
        "",
        f"colocated: TTFT mean {colocated['ttft_ms']['mean']:.0f} ms, "
        f"p99 {colocated['ttft_ms']['p99']:.0f} ms",
        "",
        "| skip_prefill_tokens | prefills | skipped | held turns | held skipped | cold turns | cold skipped "
        "| TTFT mean ms | TTFT p99 ms | transferred tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    checks = []
    for threshold in (int(t) for t in args.thresholds.split(",")):
        spec = PdSpec.split(prefill, engines - prefill, skip_prefill_tokens=threshold)
        summary, _, pd = run(sc, spec)
        assert pd is not None
        skipped = sum(pd["skipped"].values())
        lines.append(
            f"| {threshold} | {pd['prefills']} | {skipped} | {pd['held_turns']} "
            f"| {pd['held_skipped_fraction']:.1%} | {pd['cold_turns']} | {pd['cold_skipped']} "
            f"| {summary['ttft_ms']['mean']:.0f} | {summary['ttft_ms']['p99']:.0f} "
            f"| {pd['transferred_tokens']} |"
        )
        checks.append(decider_check(threshold, pd))
    return [*lines, "", *checks]


def decider_check(threshold: int, pd: dict[str, Any]) -> str:
    """The target: >= 80 % of the held turns skip their prefill, no cold turn does."""
    if not pd["held_turns"]:
        held = "no turn held within the threshold (n/a)"
        return f"target at {threshold}: {held}; {pd['cold_skipped']} cold skipped"
    ok = pd["held_skipped_fraction"] >= 0.8 and pd["cold_skipped"] == 0
    return (
        f"target at {threshold}: skips {pd['held_skipped_fraction']:.1%} of held turns (>= 80 %), "
        f"{pd['cold_skipped']} cold skipped (0): {'MET' if ok else 'NOT MET'}"
    )


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({r.workload for r in rows}, key=[r.workload for r in rows].index)
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 3.6 * len(workloads)), squeeze=False)
    for line, workload in enumerate(workloads):
        for col, (metric, title) in enumerate((("ttft", "TTFT p99"), ("tpot", "TPOT p99 (decode ITL)"))):
            ax = axes[line][col]
            _plot_ratios(ax, [r for r in rows if r.workload == workload], metric)
            ax.set_title(f"{workload}: {title}, P/D / colocated (SIMULATED)", fontsize=9)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_yscale("log")
            ax.set_xlabel("prefill share of the engines")
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _plot_ratios(ax: Any, rows: list[Row], metric: str) -> None:
    cells = sorted({(r.engines, r.load) for r in rows})
    for engines, load in cells:
        group = [r for r in rows if (r.engines, r.load) == (engines, load)]
        base = next(r for r in group if r.fleet == "colocated")
        split = [r for r in group if r.fleet != "colocated"]
        shares = [int(r.fleet.split("P")[0]) / engines for r in split]
        value = (lambda r: r.ttft("p99")) if metric == "ttft" else (lambda r: r.tpot("p99"))
        ratios = [value(r) / value(base) for r in split]
        ax.plot(shares, ratios, marker="o", label=f"{engines} engines, {load:g} req/s each")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="long-prompts,mixed")
    p.add_argument("--engines", default="16,32,64")
    p.add_argument("--loads", default="2,4", help="requests/s per engine")
    p.add_argument("--splits", default="0.25,0.5,0.75", help="prefill shares of the engines")
    p.add_argument("--requests-per-engine", type=int, default=60)
    p.add_argument("--decider-engines", type=int, default=16)
    p.add_argument("--decider-load", type=float, default=2.0)
    p.add_argument("--decider-requests", type=int, default=2000)
    p.add_argument("--thresholds", default="0,256,1024,4096")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--skip-decider", action="store_true")
    p.add_argument("--out", type=Path, default=None, help="also write the tables here")
    p.add_argument("--json", type=Path, default=None, help="the sweep's rows as JSON")
    p.add_argument("--plot", type=Path, default=None, help="the sweep's ratios as a PNG")
    args = p.parse_args(argv)
    started = time.perf_counter()
    lines: list[str] = []
    rows: list[Row] = []
    if not args.skip_sweep:
        rows = sweep(args)
        lines += [*sweep_table(rows), "", *target_lines(rows), ""]
    if not args.skip_decider:
        lines += decider(args)
    lines += ["", f"(SIMULATED; wall {time.perf_counter() - started:.0f} s; {' '.join(sys.argv[1:])})"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    if args.json is not None and rows:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    if args.plot is not None and rows:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
