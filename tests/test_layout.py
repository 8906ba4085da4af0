"""The package layout's rules, checked over the source: no import cycle between modules anywhere, none
between the parts of any package (its subpackages and modules, each taken whole), and other packages
reach a product package only through its front door (the names its ``__init__`` lists in ``__all__``);
so do the benchmarks' scripts (``benchmarks/``), but for the few named in ``BENCHMARK_BREACHES``.
import-linter (``.importlinter``, run by ``make lint``) checks the layers and the pure core."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
BENCHMARKS = ROOT / "benchmarks"
PRODUCT = ("routing", "pool", "replication", "node", "proxy", "epp")
# the benchmarks' imports past a front door, each with the reason no front door serves it; the check fails
# on any other, and on an entry here that no script makes any more
BENCHMARK_BREACHES = {
    # the two floors that answer as the router does (aiohttp-direct, protocol-request) write their answers
    # with the proxy edge's own writer, on the edge's request: what the table measures is that writer
    # without the router's work, and the writer is no API of the proxy
    "floor_servers/floor_common.py: from prefix_router.proxy.edge import ...": "the edge's answer writer",
    "floor_servers/floor_common.py: from prefix_router.proxy.edge.request import ...": "the edge's request",
}


def modules() -> dict[str, Path]:
    """Every module of the source tree by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _guarded(node: ast.If) -> bool:
    """``if TYPE_CHECKING:`` (imports for annotations only)."""
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import the module can run, at its top or inside a function (a function-level import only
    hides a cycle), but not those under ``if TYPE_CHECKING:`` (annotations only)."""
    guarded = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _guarded(node)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in guarded:
            yield node


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules its imports run: ``import a.b`` names ``a.b``; ``from a import b``
    names ``a`` (its ``__init__`` runs and is read) and also ``a.b`` when that is a module."""
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        for node in imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = _package_of(name, path).split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycles_are_found() -> None:
    """The checker itself: a two-module loop and a three-module loop are reported, a chain is not."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert cycles(graph) == [["a", "b"], ["c", "d", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules() -> None:
    assert cycles(edges(modules())) == []


def parts_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The imports between ``package``'s parts: each module or subpackage directly inside it, taken whole
    (what any module inside a part imports from inside another part). The package's own ``__init__``
    belongs to no part."""
    prefix = package + "."

    def part(module: str) -> str | None:
        return module[len(prefix) :].split(".")[0] if module.startswith(prefix) else None

    found: dict[str, set[str]] = {}
    for name, targets in graph.items():
        source = part(name)
        if source is None:
            continue
        found.setdefault(source, set()).update(t for t in map(part, targets) if t is not None and t != source)
    return found


def test_parts_loops_are_found() -> None:
    """The checker itself: two subpackages that import each other, through any of their modules, form a
    loop; a module's import of the package's front door does not."""
    graph = {"p": {"p.a.x"}, "p.a.x": {"p.b.y"}, "p.b.y": set(), "p.b.z": {"p.a"}, "p.a": {"p"}}
    assert cycles(parts_graph(graph, "p")) == [["a", "b"]]
    assert cycles(parts_graph({**graph, "p.b.z": set()}, "p")) == []


def test_no_import_loop_between_the_parts_of_a_package() -> None:
    graph = edges(mods := modules())
    packages = sorted(name for name, path in mods.items() if path.name == "__init__.py")
    loops = {p: found for p in packages if (found := cycles(parts_graph(graph, p)))}
    assert loops == {}


def _owner(module: str) -> str:
    """The top-level package a module belongs to (``lab`` for the lab's)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


@pytest.mark.parametrize("package", PRODUCT)
def test_front_door_lists_real_names(package: str) -> None:
    door = importlib.import_module(f"prefix_router.{package}")
    names = getattr(door, "__all__", None)
    assert names, f"prefix_router.{package} declares no __all__"
    assert sorted(set(names)) == sorted(names), "a name listed twice"
    missing = [n for n in names if not hasattr(door, n)]
    assert missing == []


def front_doors() -> dict[str, frozenset[str]]:
    """Each product package's front door: the names its ``__init__`` lists in ``__all__``."""
    return {p: frozenset(importlib.import_module(f"prefix_router.{p}").__all__) for p in PRODUCT}


def past_front_doors(tree: ast.Module, owner: str, doors: dict[str, frozenset[str]]) -> list[str]:
    """The imports of ``tree`` (a module of the package ``owner``; ``""``: of none) that reach another
    product package past its front door: a module inside it (``import prefix_router.p.m``,
    ``from prefix_router.p.m import ...``), or a name its ``__all__`` does not list."""
    wrong: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "prefix_router" and len(parts) > 2 and parts[1] in doors and parts[1] != owner:
                    wrong.append(f"import {alias.name}")
            continue
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("prefix_router."):
            continue
        target = node.module.split(".")[1]
        if target not in doors or target == owner:
            continue
        if node.module != f"prefix_router.{target}":
            wrong.append(f"from {node.module} import ...")
        else:
            wrong.extend(
                f"{a.name} is not in {target}.__all__" for a in node.names if a.name not in doors[target]
            )
    return wrong


def test_breaches_of_a_front_door_are_found() -> None:
    """The checker itself: a module inside another product package, imported either way, and a name its
    front door does not list are reported; the front door's own names, the package's own modules and
    packages that are no product package are not."""
    source = """
import prefix_router.routing.index as index
import prefix_router.proxy
from prefix_router.node.state import STATE
from prefix_router.routing import Router, index
from prefix_router.pool.worker import Worker
from prefix_router.lab.bench import overhead
from prefix_router.protocol import SESSION_HEADER
"""
    doors = {"routing": frozenset({"Router"}), "node": frozenset({"STATE"}), "pool": frozenset({"Worker"})}
    assert past_front_doors(ast.parse(source), "", doors) == [
        "import prefix_router.routing.index",
        "from prefix_router.node.state import ...",
        "index is not in routing.__all__",
        "from prefix_router.pool.worker import ...",
    ]
    assert past_front_doors(ast.parse(source), "routing", doors) == [
        "from prefix_router.node.state import ...",
        "from prefix_router.pool.worker import ...",
    ]


def test_other_packages_import_product_packages_through_their_front_door() -> None:
    doors = front_doors()
    wrong = [
        f"{name}: {breach}"
        for name, path in modules().items()
        for breach in past_front_doors(ast.parse(path.read_text()), _owner(name), doors)
    ]
    assert wrong == []


def test_benchmarks_import_product_packages_through_their_front_door() -> None:
    """The benchmarks' scripts (the lab's tools, as any user of the packages) take a product package's
    names from its front door, but for the breaches ``BENCHMARK_BREACHES`` names; each of those is still
    made (a breach gone leaves the list)."""
    doors = front_doors()
    found = {
        f"{path.relative_to(BENCHMARKS)}: {breach}"
        for path in sorted(BENCHMARKS.rglob("*.py"))
        for breach in past_front_doors(ast.parse(path.read_text()), "", doors)
    }
    assert sorted(found - BENCHMARK_BREACHES.keys()) == []
    assert sorted(BENCHMARK_BREACHES.keys() - found) == []
