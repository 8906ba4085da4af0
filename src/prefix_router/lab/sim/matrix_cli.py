"""``prefix-router sim-matrix``: the policy evaluation matrix of docs/benchmarks.md (simulated)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

from prefix_router.lab.sim import matrix
from prefix_router.lab.sim.cli import progress_bars, routing_knobs
from prefix_router.lab.sim.matrix_targets import failures, markdown, summary_table


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sim-matrix",
        help="every policy on the evaluation matrix: workloads x load levels x cache sizes (simulated)",
    )
    p.add_argument("--workloads", default=None, help="comma-separated keys (default: all five)")
    p.add_argument("--loads", default=",".join(matrix.LOADS))
    p.add_argument("--caches", default=",".join(matrix.CACHES))
    p.add_argument("--policies", default=",".join(matrix.POLICIES))
    p.add_argument("--small", action="store_true", help="the small version asserted by tests/lab/sim")
    p.add_argument("--json", dest="json_out", default=None, help="write every cell's report here")
    p.add_argument("--markdown", default=None, help="write the tables here")
    p.add_argument("--plot", default=None, help="write a PNG here (hit rate / oracle, relative mean TTFT)")
    p.add_argument("--config", metavar="FILE", help="a `serve` YAML config: its routing section")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="routing.KEY=VALUE")
    p.add_argument("--calibrate", action="store_true", help="find the rates of the load levels instead")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_matrix)


def _selected(args: argparse.Namespace) -> list[matrix.MatrixWorkload]:
    table = matrix.small_matrix() if args.small else matrix.default_matrix()
    if args.workloads is None:
        return list(table)
    keys = [k.strip() for k in args.workloads.split(",") if k.strip()]
    known = {w.key: w for w in table}
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValueError(f"unknown workloads {unknown}; choose from {', '.join(known)}")
    return [known[k] for k in keys]


def _names(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ValueError(f"unknown {what} {bad}; choose from {', '.join(allowed)}")
    return names


def run_matrix(args: argparse.Namespace) -> int:
    console = Console() if sys.stdout.isatty() else Console(width=160)
    try:
        workloads = _selected(args)
        loads = _names(args.loads, matrix.LOADS, "loads")
        caches = _names(args.caches, matrix.CACHES, "caches")
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        knobs = routing_knobs(args.config, args.set)
    except (KeyError, ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)  # one line, whatever the width
        return 2
    if args.calibrate:
        for w in workloads:
            console.print(
                f"{w.key}: {matrix.calibrate(w)} (arrival-rate multipliers, least_load busy 0.3/0.8)"
            )
        return 0
    document: dict[str, Any] = {"simulated": True, "policies": policies, "knobs": knobs, "cells": []}
    with progress_bars(not args.no_progress) as progress:
        for cell in matrix.cells(workloads, loads, caches):
            console.print(f"cell {cell.label}", style="dim")
            document["cells"].append(matrix.run_cell(cell, policies, knobs, progress))
            if args.json_out:  # after every cell: a long run can be followed, and survives a stop
                matrix.write_json(args.json_out, document)
    document["failures"] = failures(document["cells"]) if "prefix" in policies else []
    if args.json_out:
        matrix.write_json(args.json_out, document)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as out:
            out.write(markdown(document) + "\n")
    if args.plot and document["cells"]:
        from prefix_router.lab.sim.matrix_plot import plot_matrix

        plot_matrix(document, args.plot)
    console.print(summary_table(document["cells"]) if "prefix" in policies else "")
    for line in document["failures"]:
        console.print(f"target missed: {line}")
    return 0
