"""The fair peer run's tables from its result files (``benchmarks/peers.py`` writes them).

    .venv/bin/python benchmarks/peers_table.py OUT [OUT2 ...] [--json OUT/peers.json] \
        [--markdown OUT/peers.md] [--plot OUT/peers.png]

With several directories, a router's runs of a cell in a later one replace that router's runs of that
cell in the earlier ones (re-measure some rows on newer code, keep the others; each row lists the
commits it was measured at in the JSON).

OUT holds ``runs.json`` (what ran: cells, rates, commands) and one directory per cell
(``<workload>-<load>/``) with one ``prefix-router bench --json`` file per router and that router's
Prometheus page (``<router>.metrics.txt``). Prints the results table and the verdict against the peers
(TTFT mean and p99 of ``prefix-router prefix`` vs each peer row), writes them as Markdown and the whole
matrix as JSON. Exit status 0 whether or not the targets were met (the verdict says).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefix_router.lab.bench import merge, peer_matrix, plots


def load_cells(outs: Sequence[Path]) -> list[dict[str, Any]]:
    """One entry per cell: workload, load, rate, the pooled document and vllm-router's decisions. With
    several directories, a router's runs of a cell in a later directory replace that router's runs there
    in the earlier ones (re-measure some rows, keep the others)."""
    rows: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for out in outs:
        fresh: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for run in json.loads((out / "runs.json").read_text())["runs"]:
            if run["rc"] != 0:
                print(
                    f"left out (exit {run['rc']}): {run['workload']} {run['load']} {run['label']}",
                    file=sys.stderr,
                )
                continue
            run = {**run, "dir": str(out / f"{run['workload']}-{run['load']}")}
            fresh.setdefault((run["workload"], run["load"], run["label"]), []).append(run)
        rows.update(fresh)
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for (workload, load, label), runs in rows.items():
        cell = cells.setdefault((workload, load), {"workload": workload, "load": load, "runs": {}})
        cell["rate"] = runs[0]["rate"]
        cell["runs"][label] = runs
    for cell in cells.values():
        _pool_cell(cell)
    return list(cells.values())


def _pool_cell(cell: dict[str, Any]) -> None:
    labels = sorted(cell["runs"], key=lambda label: (peer_matrix.is_peer(label), label))
    documents = {label: [_json(run) for run in cell["runs"][label]] for label in labels}
    checked = merge.merge([docs[0] for docs in documents.values()])  # same workers and workload?
    policies = {
        label: peer_matrix.pool(
            [doc["policies"][label] for doc in docs],
            [rec for run in cell["runs"][label] for rec in _records(run)],
        )
        for label, docs in documents.items()
    }
    for label, pooled in policies.items():
        runs = cell["runs"][label]
        loads = [run["load_avg"] for run in runs if run.get("load_avg") is not None]
        pooled["machine_load_avg"] = round(sum(loads) / len(loads), 1) if loads else None
        pooled["commits"] = sorted({str(run.get("commit", "unrecorded")) for run in runs})
    cell["document"] = {**checked, "policies": policies}
    cell["router_decisions"] = {label: _decisions(cell["runs"][label]) for label in labels}


def _json(run: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads((Path(run["dir"]) / f"{run['file']}.json").read_text()))


def _records(run: dict[str, Any]) -> list[dict[str, Any]]:
    path = Path(run["dir"]) / f"{run['file']}.records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _decisions(runs: list[dict[str, Any]]) -> dict[str, float]:
    """vllm-router's decision counters summed over the repeats (empty for other routers)."""
    total: dict[str, float] = {}
    for run in runs:
        path = Path(run["dir"]) / f"{run['file']}.metrics.txt"
        for key, value in peer_matrix.router_decisions(path.read_text() if path.exists() else "").items():
            total[key] = total.get(key, 0.0) + value
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "out", type=Path, nargs="+", help="the directory benchmarks/peers.py wrote (later ones replace rows)"
    )
    parser.add_argument("--json", type=Path, help="write the matrix document here")
    parser.add_argument("--markdown", type=Path, help="write the Markdown tables here")
    parser.add_argument("--plot", type=Path, help="write a PNG of TTFT mean and p99 per cell and router here")
    args = parser.parse_args(argv)
    matrix = peer_matrix.build(load_cells(args.out))
    text = peer_matrix.markdown(matrix)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(matrix, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(text)
    if args.plot:
        plots.peer_matrix(matrix, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
