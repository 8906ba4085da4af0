"""The ``prefix-router`` command: one subcommand per tool, each defined next to the code it runs.

Each subcommand module exposes ``register(subparsers)`` which adds its parser and sets ``func`` to a
callable taking the parsed ``argparse.Namespace`` and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# module path -> registers these subcommands
_COMMAND_MODULES = (
    "prefix_router.proxy.cli",  # serve
    "prefix_router.sim.cli",  # engine-sim, simulate
    "prefix_router.sim.matrix_cli",  # sim-matrix
    "prefix_router.bench.cli",  # bench, demo, bench-index, bench-overhead, fidelity
    "prefix_router.launch.cli",  # engines
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefix-router",
        description="A prefix-cache-aware, load-aware, OpenAI-compatible router for self-hosted LLM engines.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(int(args.func(args) or 0))
