"""A quick mutation audit: single mutations of a module, each run against that module's tests.

For each audited module (``AUDIT``: module -> its tests), the script lists every mutation site of the
kinds below, draws a seeded sample of them, and for each one copies ``src/`` to a temporary directory
once, writes the mutated module there and runs the module's tests on the copy (``PYTHONPATH`` first, no
bytecode written, so no stale ``.pyc`` can hide a mutant). A mutant is *killed* when the tests fail (or
run three times as long as the unmutated ones, at most ``--timeout-s``), *survives* when they pass.
Before the mutants, the unmutated copy must pass (else the module is reported as broken, not audited).

Mutations (one at a time, on the AST, written back with ``ast.unparse``):

- ``compare``: a comparison operator flipped (``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``,
  ``in`` and ``not in``, ``is`` and ``is not``);
- ``off_by_one``: an integer constant other than 0 in an expression, plus one;
- ``bool``: ``and`` and ``or`` swapped; ``not x`` made ``x``;
- ``drop``: a statement in a function body (an assignment, an expression call, an augmented assignment,
  a ``raise`` or a ``return`` with a value) replaced by ``pass``; log calls are left alone (no behaviour
  a test should pin).

Equivalent mutants (a change no behaviour can tell) are not detected: a survivor is a lead to read, and
the rate a lower bound. Usage (from the repository root; minutes of CPU per module)::

    python scripts/mutation_audit.py --per-module 12 --seed 0
    python scripts/mutation_audit.py --module routing/precise.py --per-module 20 --list-survivors
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "prefix_router"

# module (under src/prefix_router/) -> the tests that hold it (issue 43's list, the endpoint picker aside)
AUDIT: dict[str, list[str]] = {
    "proxy/run/lean.py": ["tests/proxy/run/test_lean.py", "tests/proxy/run/test_connection_paths.py"],
    "pool/kv_events.py": ["tests/pool/test_kv_events.py", "tests/pool/test_kv_events_flood.py"],
    "routing/precise.py": ["tests/routing/test_precise.py", "tests/routing/test_router_precise.py"],
    "replication/sync.py": [
        "tests/replication/test_sync.py",
        "tests/replication/test_trust.py",
        "tests/replication/test_faults.py",
        "tests/replication/test_load.py",
    ],
    "node/request/decoding.py": [
        "tests/node/request/test_decoding.py",
        "tests/node/request/test_decoding_bounds.py",
    ],
    "routing/policies/prefix.py": [
        "tests/routing/test_prefix_over_cap.py",
        "tests/routing/test_prefix_policy.py",
        "tests/routing/test_placement.py",
        "tests/routing/test_router.py",
    ],
}

FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}  # fmt: skip
DROPPABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Raise, ast.Return)


@dataclass(frozen=True, slots=True)
class Site:
    """One mutation: the ``index``-th node (in ``ast.walk`` order) of the module, and what is done."""

    kind: str
    index: int
    line: int
    detail: str


def _function_bodies(tree: ast.AST) -> set[int]:
    """ids of the statements directly in a function's body (or a nested block of it)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for child in ast.walk(node):
                if child is not node and isinstance(child, ast.stmt):
                    inside.add(id(child))
    return inside


def _droppable(node: ast.AST, in_function: set[int]) -> bool:
    if not isinstance(node, DROPPABLE) or id(node) not in in_function:
        return False
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return False  # a docstring
    if isinstance(node, ast.Expr) and _is_log_call(node.value):
        return False  # a log line: no behaviour a test should pin
    return not (isinstance(node, ast.Return) and node.value is None)


def _is_log_call(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("log", "logger", "logging")
    )


def sites(tree: ast.AST) -> list[Site]:
    """Every mutation site of the module, in a stable order."""
    out: list[Site] = []
    in_function = _function_bodies(tree)
    annotations = {id(n) for a in ast.walk(tree) for n in _annotation_nodes(a)}
    for index, node in enumerate(ast.walk(tree)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare) and type(node.ops[0]) in FLIP:
            out.append(Site("compare", index, line, type(node.ops[0]).__name__))
        elif (
            isinstance(node, ast.Constant)
            and type(node.value) is int
            and node.value != 0
            and id(node) not in annotations
        ):
            out.append(Site("off_by_one", index, line, str(node.value)))
        elif isinstance(node, ast.BoolOp):
            out.append(Site("bool", index, line, type(node.op).__name__))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append(Site("bool", index, line, "not"))
        elif _droppable(node, in_function):
            out.append(Site("drop", index, line, type(node).__name__))
    return out


def _annotation_nodes(node: ast.AST) -> Iterator[ast.AST]:
    annotation = getattr(node, "annotation", None) or getattr(node, "returns", None)
    if isinstance(annotation, ast.AST):
        yield from ast.walk(annotation)


class _Mutate(ast.NodeTransformer):
    def __init__(self, site: Site, nodes: list[ast.AST]) -> None:
        self.site, self.target = site, nodes[site.index]

    def visit(self, node: ast.AST) -> ast.AST:
        if node is not self.target:
            return super().visit(node)
        kind = self.site.kind
        if kind == "compare" and isinstance(node, ast.Compare):
            node.ops = [FLIP[type(node.ops[0])](), *node.ops[1:]]
        elif kind == "off_by_one" and isinstance(node, ast.Constant) and type(node.value) is int:
            node.value += 1
        elif kind == "bool" and isinstance(node, ast.BoolOp):
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif kind == "bool" and isinstance(node, ast.UnaryOp):
            return node.operand
        elif kind == "drop":
            return ast.copy_location(ast.Pass(), node)
        return node


def mutate(source: str, site: Site) -> str:
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    mutated = _Mutate(site, nodes).visit(tree)
    return ast.unparse(ast.fix_missing_locations(mutated))


def run_tests(src: Path, tests: list[str], timeout_s: float) -> str:
    """``passed``, ``failed`` or ``timeout``: the tests run on the ``src`` copy."""
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", "-p", "no:cacheprovider", *tests]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "passed" if done.returncode == 0 else "failed"


@dataclass(slots=True)
class Result:
    module: str
    killed: int = 0
    total: int = 0
    broken: bool = False
    seconds: float = 0.0
    survivors: list[Site] | None = None


def audit(module: str, tests: list[str], count: int, rng: random.Random, timeout_s: float) -> Result:
    result = Result(module, survivors=[])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
        target = src / PACKAGE / module
        original = target.read_text()
        begun = time.monotonic()
        if run_tests(src, tests, timeout_s) != "passed":
            result.broken = True
            return result
        # a mutant that makes the tests run 3x as long as the unmutated ones (a loop that never ends): killed
        timeout_s = min(timeout_s, 3 * (time.monotonic() - begun) + 5)
        candidates = sites(ast.parse(original))
        for site in sorted(rng.sample(candidates, min(count, len(candidates))), key=lambda s: s.index):
            target.write_text(mutate(original, site))
            outcome = run_tests(src, tests, timeout_s)
            result.total += 1
            if outcome == "passed":
                assert result.survivors is not None
                result.survivors.append(site)
            else:
                result.killed += 1
            target.write_text(original)
            print(f"  {module}:{site.line} {site.kind} {site.detail}: {outcome}", flush=True)
    result.seconds = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--module", action="append", help="audit only these (paths under src/prefix_router/)")
    parser.add_argument("--per-module", type=int, default=12, help="mutants drawn per module")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="a test run longer than this: killed")
    parser.add_argument("--list-survivors", action="store_true")
    args = parser.parse_args(argv)
    modules = args.module or list(AUDIT)
    results = []
    for module in modules:
        print(f"{module} ({', '.join(AUDIT[module])})", flush=True)
        results.append(
            audit(
                module, AUDIT[module], args.per_module, random.Random(f"{args.seed}:{module}"), args.timeout_s
            )
        )
    print("\nmodule | killed / mutants | rate | seconds")
    killed = total = 0
    for r in results:
        if r.broken:
            print(f"{r.module} | the unmutated tests fail: not audited")
            continue
        killed, total = killed + r.killed, total + r.total
        rate = f"{100 * r.killed / r.total:.0f} %" if r.total else "-"
        print(f"{r.module} | {r.killed} / {r.total} | {rate} | {r.seconds:.0f}")
        if args.list_survivors:
            for s in r.survivors or []:
                print(f"    survived: line {s.line} {s.kind} {s.detail}")
    if total:
        print(f"all | {killed} / {total} | {100 * killed / total:.0f} %")


if __name__ == "__main__":
    main()
