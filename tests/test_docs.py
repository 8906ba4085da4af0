"""The docs name what exists: every dotted ``prefix_router.`` path in a docstring of ``src/`` or in the
Markdown docs (README.md, docs/*.md, benchmarks/README.md) resolves to a module or an attribute of one,
every file path they quote exists, every link between the docs lands on a file and a heading, and the
README's lines stay short. A failure lists every unresolved name with its file and line."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "prefix_router"
DOCS = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
README_MAX_LINE = 300
BENCHMARKS_MAX_LINES = 800

DOTTED = re.compile(r"(?<![\w.])prefix_router(?:\.[A-Za-z_]\w*)+")
# a quoted module path inside the package, for the packages no configuration key is named after
# (``routing.keys.block_chars`` is a key, ``proxy.edge.head`` a module): read as ``prefix_router.`` + it
RELATIVE = re.compile(r"`+((?:proxy|node|lab)(?:\.[A-Za-z_]\w*)+)`+")
# a quoted path: at least one slash and a file extension; placeholders (OUT/, <cell>, $VAR, *) are skipped
QUOTED_PATH = re.compile(r"`+([\w./-]+/[\w.-]+\.(?:py|c|sh|md|json|jsonl|txt|png|yaml))`+")
PLACEHOLDER = re.compile(r"(^|/)[A-Z][A-Z_]*(/|$)|^/|\.\./|\.\.\.")
LINK = re.compile(r"\]\(([^)\s]+)\)")
SEARCHED = ("src", "tests", "benchmarks", "scripts", "deploy", "docs")
# other projects' files the docs cite as sources (their first folder is also one of ours)
FOREIGN = frozenset({"docs/references/production_metrics.md", "docs/source/reference/metrics.md"})


@dataclass(frozen=True)
class Mention:
    """A name found in a doc or docstring, and where."""

    name: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.name}"


def _md_lines(path: Path) -> Iterator[tuple[int, str]]:
    """A Markdown file's lines with their numbers."""
    yield from enumerate(path.read_text().splitlines(), start=1)


def docstrings() -> Iterator[tuple[Path, int, str]]:
    """Every docstring of ``src/``: its file, the line it starts on, its text."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    value = body[0].value.value
                    if isinstance(value, str):
                        yield path, body[0].lineno, value


def _found(pattern: re.Pattern[str], path: Path, first_line: int, text: str) -> Iterator[Mention]:
    for match in pattern.finditer(text):
        line = first_line + text.count("\n", 0, match.start())
        yield Mention(match.group(1) if match.groups() else match.group(0), path, line)


def in_docs(pattern: re.Pattern[str]) -> list[Mention]:
    return [m for doc in DOCS for number, line in _md_lines(doc) for m in _found(pattern, doc, number, line)]


def in_docstrings(pattern: re.Pattern[str]) -> list[Mention]:
    return [m for path, start, text in docstrings() for m in _found(pattern, path, start, text)]


@cache
def names_in_code() -> frozenset[str]:
    """Dotted names the code itself uses as strings (a logger's name, ``prefix_router.access``)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return frozenset(found)


def _in_c_source(parts: list[str]) -> bool:
    """``prefix_router.routing._lru.BlockLRU``: a C module of the compiled build (absent from the pure
    one) and names its source defines."""
    for cut in range(len(parts), 1, -1):
        source = SRC.joinpath(*parts[:cut]).with_suffix(".c")
        if source.is_file():
            text = source.read_text()
            return all(name in text for name in parts[cut:])
    return False


@cache
def resolves(dotted: str) -> bool:
    """An importable module, an attribute of one, a C module's name, or a name the code uses."""
    parts = dotted.split(".")
    if dotted in names_in_code() or _in_c_source(parts):
        return True
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as missing:
            if missing.name is not None and module_name.startswith(missing.name):
                continue
            raise
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


@cache
def project_files() -> tuple[str, ...]:
    """Every file and folder under the searched top folders, as paths relative to the root."""
    found = []
    for top in SEARCHED:
        for path in (ROOT / top).rglob("*"):
            if "__pycache__" not in path.parts:
                found.append(path.relative_to(ROOT).as_posix())
    return tuple(found)


@cache
def project_folders() -> frozenset[str]:
    """The names a path of this project starts with: the root's folders and every folder of the package
    (``edge/head.py``); a path starting otherwise is another project's (``vllm/v1/...``)."""
    names = {path.name for path in ROOT.iterdir() if path.is_dir()}
    return frozenset(names | {path.name for path in PACKAGE.rglob("*") if path.is_dir()})


def path_exists(quoted: str, where: Path) -> bool:
    """A quoted path of this project exists relative to the root, the quoting file or the package, or as
    the end of a project path (``edge/head.py`` for ``src/prefix_router/proxy/edge/head.py``)."""
    if PLACEHOLDER.search(quoted) or quoted in FOREIGN:
        return True
    if quoted.split("/")[0] not in project_folders() | {"..", "."}:
        return True
    if any((base / quoted).exists() for base in (ROOT, where.parent, PACKAGE)):
        return True
    return any(path.endswith("/" + quoted) for path in project_files())


def unresolved_paths(mentions: list[Mention]) -> list[str]:
    return [str(m) for m in mentions if not path_exists(m.name, m.path)]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a Markdown file's headings (code blocks left out; repeats numbered as GitHub does)."""
    seen: dict[str, int] = {}
    fenced = False
    for _, line in _md_lines(path):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            slug = _slug(line.lstrip("#"))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            if count:
                seen[f"{slug}-{count}"] = 1
    return frozenset(seen)


def broken_link(target: str, doc: Path) -> bool:
    """A relative link whose file is missing, or whose ``#anchor`` names no heading of a Markdown file."""
    if re.match(r"[a-z]+:", target):
        return False
    file_part, _, anchor = target.partition("#")
    linked = (doc.parent / file_part).resolve() if file_part else doc
    if not linked.exists():
        return True
    return bool(anchor) and linked.suffix == ".md" and anchor not in anchors(linked)


def _report(what: str, found: list[str]) -> str:
    return f"{len(found)} {what}:\n" + "\n".join(found)


def test_dotted_paths_in_the_docs_resolve() -> None:
    found = [str(m) for m in in_docs(DOTTED) if not resolves(m.name)]
    assert not found, _report("prefix_router paths in the docs that resolve to nothing", found)


def test_dotted_paths_in_docstrings_resolve() -> None:
    found = [str(m) for m in in_docstrings(DOTTED) if not resolves(m.name)]
    assert not found, _report("prefix_router paths in docstrings that resolve to nothing", found)


def test_module_paths_in_the_docs_resolve() -> None:
    found = [str(m) for m in in_docs(RELATIVE) if not resolves(f"prefix_router.{m.name}")]
    assert not found, _report("package-relative module paths in the docs that resolve to nothing", found)


def test_module_paths_in_docstrings_resolve() -> None:
    found = [str(m) for m in in_docstrings(RELATIVE) if not resolves(f"prefix_router.{m.name}")]
    assert not found, _report("package-relative module paths in docstrings that resolve to nothing", found)


def test_file_paths_in_the_docs_exist() -> None:
    found = unresolved_paths(in_docs(QUOTED_PATH))
    assert not found, _report("quoted file paths in the docs that do not exist", found)


def test_file_paths_in_docstrings_exist() -> None:
    found = unresolved_paths(in_docstrings(QUOTED_PATH))
    assert not found, _report("quoted file paths in docstrings that do not exist", found)


def test_links_between_the_docs_land() -> None:
    found = [
        f"{doc.relative_to(ROOT)}:{number}: {match.group(1)}"
        for doc in DOCS
        for number, line in _md_lines(doc)
        for match in LINK.finditer(line)
        if broken_link(match.group(1), doc)
    ]
    assert not found, _report("links to a missing file or heading", found)


def test_readme_lines_are_short() -> None:
    found = [
        f"README.md:{number}: {len(line)} characters"
        for number, line in _md_lines(ROOT / "README.md")
        if len(line) > README_MAX_LINE
    ]
    assert not found, _report(f"README lines over {README_MAX_LINE} characters", found)


def test_benchmarks_doc_holds_the_present_only() -> None:
    lines = (ROOT / "docs" / "benchmarks.md").read_text().count("\n")
    assert lines <= BENCHMARKS_MAX_LINES, f"docs/benchmarks.md: {lines} lines (history belongs in git)"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """Each check rejects what it is for: a missing module, attribute, file, heading."""
    assert not resolves("prefix_router.routing.no_such_module")
    assert not resolves("prefix_router.routing.NoSuchName")
    assert resolves("prefix_router.routing")
    quoted = _found(RELATIVE, ROOT, 1, "``proxy.edge.head`` and the key `routing.policy`")
    assert [m.name for m in quoted] == ["proxy.edge.head"]
    assert not path_exists("routing/no_such_file.py", ROOT / "README.md")
    doc = tmp_path / "a.md"
    doc.write_text("# A heading\n\n```sh\n# not a heading\n```\n")
    assert not broken_link("a.md#a-heading", doc)
    assert broken_link("a.md#not-a-heading", doc)
    assert broken_link("b.md", doc)
