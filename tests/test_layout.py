"""The package layout's rules, checked over the source: no import cycle between modules anywhere, none
between the parts of any package (its subpackages and modules, each taken whole), and other packages
reach a product package only through its front door (the names its ``__init__`` lists in ``__all__``).
import-linter (``.importlinter``, run by ``make lint``) checks the layers and the pure core."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PRODUCT = ("routing", "pool", "replication", "node", "proxy")


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


def test_other_packages_import_product_packages_through_their_front_door() -> None:
    doors = {p: set(importlib.import_module(f"prefix_router.{p}").__all__) for p in PRODUCT}
    wrong: list[str] = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("prefix_router."):
                continue
            target = node.module.split(".")[1]
            if target not in doors or target == _owner(name):
                continue
            if node.module != f"prefix_router.{target}":
                wrong.append(f"{name}: from {node.module} import ...")
            else:
                wrong.extend(
                    f"{name}: {a.name} is not in {target}.__all__"
                    for a in node.names
                    if a.name not in doors[target]
                )
    assert wrong == []
