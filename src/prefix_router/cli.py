"""The ``prefix-router`` command: one subcommand per tool, each defined next to the code it runs.

Each subcommand module exposes ``register(subparsers)`` which adds its parser and sets ``func`` to a
callable taking the parsed ``argparse.Namespace`` and returning an exit code.

The product's commands (``serve``, ``epp``) are always there. The lab's (simulator, benchmarks,
launchers) need the ``lab`` extra; without it each lab command is still listed, and running one prints the
install line and exits 2 instead of failing with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# module path -> the subcommands it registers
_PRODUCT_COMMANDS: dict[str, tuple[str, ...]] = {
    "prefix_router.proxy.run.cli": ("serve",),
    "prefix_router.epp.cli": ("epp",),
    "prefix_router.node.control.dashboard.top": ("top",),
}
_LAB_COMMANDS: dict[str, tuple[str, ...]] = {
    "prefix_router.lab.sim.cli": ("engine-sim", "simulate"),
    "prefix_router.lab.sim.matrix_cli": ("sim-matrix",),
    "prefix_router.lab.bench.cli": ("bench", "demo", "bench-index", "bench-overhead", "fidelity"),
    "prefix_router.lab.launch.cli": ("engines",),
    "prefix_router.lab.launch.replay": ("dashboard",),
}
LAB_INSTALL_HINT = "this is a lab command: install it with  pip install 'prefix-router[lab]'"


def _lab_missing(args: argparse.Namespace) -> int:
    print(
        f"prefix-router {args.command}: {LAB_INSTALL_HINT} ({args.missing_module} is missing)",
        file=sys.stderr,
    )
    return 2


def _register_missing(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], names: tuple[str, ...], missing: str
) -> None:
    for name in names:
        # no option prefix: whatever follows is taken as it is, since the real parser is not there
        stub = sub.add_parser(name, help="(lab: needs the 'lab' extra)", add_help=False, prefix_chars="\0")
        stub.add_argument("rest", nargs="*")
        stub.set_defaults(func=_lab_missing, missing_module=missing)


def _is_lab_dependency(error: ModuleNotFoundError) -> bool:
    """A missing third-party module or a lab package left out of the install, not a bug in our own code."""
    name = error.name or ""
    return not name.startswith("prefix_router") or name.startswith("prefix_router.lab")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefix-router",
        description="A prefix-cache-aware, load-aware, OpenAI-compatible router for self-hosted LLM engines.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _PRODUCT_COMMANDS:
        importlib.import_module(name).register(sub)
    for name, commands in _LAB_COMMANDS.items():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if not _is_lab_dependency(error):
                raise
            _register_missing(sub, commands, error.name or name)
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(int(args.func(args) or 0))
