"""The compiled build (``setup.py`` with ``COMPILE_ROUTING_CORE=1``) against the pure one.

The compiled core is built once per source by ``scripts/build-compiled.sh`` (cached under ``build/compiled``;
``make test`` builds it first and passes it in ``COMPILED_ROUTING_CORE_LIB``); each build runs in a
subprocess with its package first on the path. Checked: every module ``setup.py`` compiles is an extension
module there (a build that fell back to pure fails here), the C block-hash loop gives the Python loop's
hashes, the C touch loop of the index changes what the Python loop changes, and both builds make the
same decisions, keys and summaries on recorded traces.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import compiled

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "support" / "trace.py"

pytestmark = pytest.mark.timeout(1200)  # a cold build: about 4 minutes on a busy 2-core machine


def compiled_paths() -> list[str]:
    """The sources setup.py compiles (its ``COMPILED``), relative to the repository."""
    namespace: dict[str, object] = {"__name__": "setup_modules", "__file__": str(ROOT / "setup.py")}
    exec(compile((ROOT / "setup.py").read_text(), "setup.py", "exec"), namespace)
    paths = namespace["COMPILED"]
    assert isinstance(paths, list)
    return paths


def compiled_modules() -> list[str]:
    """The module names setup.py compiles."""
    return [p.removeprefix("src/").removesuffix(".py").replace("/", ".") for p in compiled_paths()]


@pytest.fixture(scope="module")
def compiled_lib() -> Path:
    return compiled.compiled_lib()


def run(lib: Path, argv: list[str], timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(lib)}
    proc = subprocess.run(
        [sys.executable, *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_every_listed_module_is_compiled(compiled_lib: Path) -> None:
    modules = compiled_modules()
    assert "prefix_router.routing.index" in modules and "prefix_router.routing.router" in modules
    script = (
        "import importlib, json, sys\n"
        "from prefix_router.routing import hashing\n"
        "print(json.dumps({m: importlib.import_module(m).__file__ for m in sys.argv[1:]}))\n"
        "from prefix_router.routing import units\n"
        "from prefix_router.routing import index\n"
        "print(hashing._chain is not None, units.count_classes is not units.count_classes_py,\n"
        "      index._chain_touch is not index.touch_chain_py)\n"
    )
    out = run(compiled_lib, ["-c", script, *modules]).splitlines()
    files = json.loads(out[0])
    assert all(f.startswith(str(compiled_lib)) and f.endswith(".so") for f in files.values()), files
    assert out[1] == "True True True"  # the C imported
    pure = run(ROOT / "src", ["-c", script, *modules]).splitlines()
    assert all(f.endswith(".py") for f in json.loads(pure[0]).values()) and pure[1] == "False False False"


def test_the_compiled_package_runs_the_trees_uncompiled_modules(compiled_lib: Path) -> None:
    """The build is cached by what it compiles; every other module is the tree's as it is now (a stale
    copy of the proxy in the compiled package would be measured and tested instead of the edit)."""
    compiled_files = {p.removeprefix("src/") for p in compiled_paths()}
    src = ROOT / "src"
    sources = [p for p in src.rglob("*.py") if "__pycache__" not in p.parts]
    assert len(sources) > 100
    stale = [
        str(p.relative_to(src))
        for p in sources
        if str(p.relative_to(src)) not in compiled_files
        and (compiled_lib / p.relative_to(src)).read_bytes() != p.read_bytes()
    ]
    assert stale == []


def test_the_c_chain_loop_gives_the_python_loops_hashes(compiled_lib: Path) -> None:
    script = """
import random
from prefix_router.routing import hashing
rng, cases = random.Random(7), 0
for _ in range(3000):
    data = rng.randbytes(rng.choice([0, 1, 15, 16, 17, 63, 64, 65, 1000, 4096, 20000]))
    block = rng.choice([1, 3, 16, 64, 256, 1000])
    seed = rng.choice([0, 1, -1, 2**63, 2**64 - 1, 2**64 + 5, rng.getrandbits(64)])
    limit = rng.choice([None, -5, 0, 1, 64, 100, 5000, 10**6])
    end = len(data) - len(data) % block
    if limit is not None:
        end = min(end, limit - limit % block)
    fast = hashing.chain_blocks(data, block, seed, limit)
    assert fast == hashing.chain_blocks_py(data, block, seed, end), (len(data), block, seed, limit)
    cases += bool(fast)
print(cases)
"""
    assert int(run(compiled_lib, ["-c", script])) > 1000  # most cases hash at least one block


CLASSES_PROPERTY = """
import random
from hypothesis import given, settings, strategies as st
from prefix_router.routing import _chain, units

# bytes from every class, ASCII text or any byte, repeated to lengths across the C loop's 255-byte runs
SPECIAL = b"09azAZ@[`{/:\\x00\\x08\\x09\\x0d\\x0e\\x1a\\x1f \\x7f\\x80\\xff,.\\n"
pieces = st.one_of(st.binary(max_size=300), st.text(max_size=100).map(str.encode),
                   st.lists(st.sampled_from(SPECIAL), max_size=300).map(bytes))
inputs = st.tuples(pieces, st.integers(1, 40)).map(lambda t: t[0] * t[1])
seen = set()

def same(data):
    want = units.count_classes_py(data)
    assert _chain.count_classes(data) == want, (data[:300], len(data), want)
    seen.update(i for i, n in enumerate(want) if n)

@settings(max_examples=2000, deadline=None, database=None)
@given(inputs)
def check(data):
    same(data)

check()
rng = random.Random(3)  # and every length to 1,100, and runs of one class past a lane's 255
for size in range(1100):
    same(bytes(rng.choice(SPECIAL) for _ in range(size)))
for byte in SPECIAL:
    for size in (254, 255, 256, 257, 510, 511, 4096, 70_000):
        same(bytes([byte]) * size)
print(sorted(seen))
"""


def test_the_c_class_count_gives_the_python_passes_counts(compiled_lib: Path) -> None:
    """``_chain.count_classes`` (one vectorised pass) against ``units.count_classes_py`` (the reference):
    the same four counts on any bytes, on every length to 1,100 and on long runs of one class, every class
    met."""
    assert run(compiled_lib, ["-c", CLASSES_PROPERTY]).strip() == "[0, 1, 2, 3]"


TOUCH_PROPERTY = """
import copy, importlib.util, sys
from collections import OrderedDict
from hypothesis import given, settings, strategies as st
from prefix_router.routing import _lru

spec = importlib.util.spec_from_file_location("pure_index", sys.argv[1])  # the tree's source, not compiled
pure = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pure)
ran, evicted = [], []

def state(draw):
    universe = draw(st.integers(1, 10))
    order = draw(st.permutations(range(universe)))
    held_ids = order[: draw(st.integers(0, universe))]
    lru = OrderedDict((b, draw(st.floats(0, 10))) for b in held_ids)
    bit = draw(st.sampled_from([1, 2, 1 << 70]))
    # mostly the index's invariant (the bit set exactly for the blocks in the LRU), sometimes not
    exact = draw(st.booleans())
    holders = {}
    for b in range(universe):
        mask = draw(st.sampled_from([0, 0, 4, 1 << 65]))
        mine = b in lru if exact else draw(st.booleans())
        if mask | (bit if mine else 0):
            holders[b] = mask | (bit if mine else 0)
    blocks = draw(st.lists(st.integers(0, universe - 1), max_size=10))
    if draw(st.booleans()):
        blocks = list(dict.fromkeys(blocks))  # a chain's blocks are distinct
    blocks = tuple(blocks) if draw(st.booleans()) else blocks
    return lru, holders, bit, blocks, draw(st.integers(0, len(blocks))), draw(st.floats(0, 20))

def run(touch, lru, holders, *rest):
    try:
        return touch(lru, holders, *rest), list(lru.items()), holders
    except KeyError as exc:  # a block held by its bit but absent from the LRU: the reference's KeyError
        return repr(exc), list(lru.items()), holders

def block_lru(ordered):
    lru = _lru.BlockLRU()
    for block, stamp in ordered.items():
        lru[block] = stamp
    return lru

@settings(max_examples=3000, deadline=None, database=None)
@given(st.data())
def check(data):
    lru, holders, bit, blocks, held, now = state(data.draw)
    want = run(pure.touch_chain_py, copy.copy(lru), dict(holders), bit, blocks, held, now)
    got = run(_lru.touch_chain, block_lru(lru), dict(holders), bit, blocks, held, now)
    assert got == want, (lru, holders, bit, blocks, held, got, want)
    chained = isinstance(want[0], int) and len(blocks) > held > 0
    want = run(pure.touch_py, copy.copy(lru), dict(holders), bit, blocks, now)
    got = run(_lru.touch, block_lru(lru), dict(holders), bit, blocks, now)
    assert got == want, (lru, holders, bit, blocks, got, want)
    count = data.draw(st.integers(0, len(lru) + 1))  # one more than it holds: the same KeyError
    want = run(pure.evict_py, copy.copy(lru), dict(holders), bit, count)
    got = run(_lru.evict, block_lru(lru), dict(holders), bit, count)
    assert got == want, (lru, holders, bit, count, got, want)
    ran.append(chained)  # after the last draw: a draw past hypothesis's budget drops the example
    evicted.append(0 < count <= len(lru) and any(b in holders for b in lru))

check()
print(sum(ran), len(ran), sum(evicted))
"""


def test_the_c_touch_loops_change_the_lru_and_holders_as_the_python_loops(compiled_lib: Path) -> None:
    """``_lru.touch_chain`` (the compiled build's touch of one chain, on a ``BlockLRU``) against
    ``index.touch_chain_py`` (on an ``OrderedDict``, the pure module's source): the same LRU, order and
    stamps included, the same holders, the same count, and the same KeyError where the reference raises
    one, on random states (inside and outside the index's invariant), chains and held prefixes; and
    ``_lru.touch`` (any blocks, a loose worker's) against ``index.touch_py``, ``_lru.evict`` against
    ``index.evict_py`` (the same KeyError past the last block) on the same states."""
    both, runs, evictions = run(
        compiled_lib, ["-c", TOUCH_PROPERTY, str(ROOT / "src/prefix_router/routing/index.py")]
    ).split()
    assert int(runs) == 3000 and int(both) > 300  # many with both a held prefix and deeper blocks
    assert int(evictions) > 300  # many evicting blocks that some worker holds


LRU_PROPERTY = """
import copy, pickle, random
from collections import OrderedDict
from hypothesis import given, settings, strategies as st
from prefix_router.routing._lru import BlockLRU

# mostly a few blocks (collisions, reuse), sometimes any 64-bit hash (signed or not), sometimes no block
MAX = 2**64
blocks = st.one_of(st.integers(-40, 40), st.integers(1 - MAX, MAX - 1), st.integers(MAX, 2 * MAX),
                   st.integers(-2 * MAX, -MAX))
ops = st.lists(st.tuples(st.integers(0, 13), blocks, st.floats(-1e9, 1e9)), max_size=400)
seen = set()

def outcome(call, lru):
    try:
        return "ok", call(lru)
    except Exception as exc:
        return "raised", type(exc).__name__

def call_of(op, block, stamp):
    return [  # stores twice: weighted so that the maps grow
        lambda d: d.__setitem__(block, stamp), lambda d: d.__setitem__(block, stamp),
        lambda d: d.move_to_end(block), lambda d: d.move_to_end(block, last=False),
        lambda d: d.pop(block, None), lambda d: d.pop(block), lambda d: d.popitem(last=False),
        lambda d: d.popitem(), lambda d: d.get(block), lambda d: (block in d, len(d)),
        lambda d: d[block], lambda d: d.__delitem__(block),
        lambda d: (list(d), list(d.items()), list(d.values()), next(iter(d.values()), None)),
        lambda d: (list(copy.copy(d).items()), list(pickle.loads(pickle.dumps(d)).items())),
    ][op]

@settings(max_examples=1500, deadline=None, database=None)
@given(ops)
def check(steps):
    ordered, fast = OrderedDict(), BlockLRU()
    for op, block, stamp in steps:
        if op < 2 and not -MAX < block < MAX:
            continue  # a BlockLRU stores blocks only (the index's keys: 64-bit hashes)
        call = call_of(op, block, stamp)
        want, got = outcome(call, ordered), outcome(call, fast)
        assert got == want, (op, block, got, want)
        seen.add((op, want[0]))
    assert list(fast.items()) == list(ordered.items())

check()
rng = random.Random(5)  # long seeded walks too: deep tables, long probe runs, many deletions in them
for walk in range(150):
    ordered, fast, universe = OrderedDict(), BlockLRU(), rng.choice([5, 60, 3000])
    for step in range(rng.choice([100, 3000])):
        block = rng.randrange(-universe, universe) if rng.random() < 0.95 else rng.getrandbits(64)
        op = rng.choice([0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])  # not the walks of every entry
        call = call_of(op, block, float(step))
        want = outcome(call, ordered)
        assert outcome(call, fast) == want, (walk, step)
        seen.add((op, want[0]))
    assert list(fast.items()) == list(ordered.items())
for lru in (OrderedDict(), BlockLRU()):  # a change of size while iterating: an error, not a wrong walk
    lru[1] = 1.0
    walk = iter(lru.items())
    lru[2] = 2.0
    try:
        next(walk)
        raise SystemExit(f"{type(lru).__name__}: no error")
    except RuntimeError:
        pass
print(len(seen))
"""


def test_the_block_lru_behaves_as_an_ordered_dict(compiled_lib: Path) -> None:
    """``_lru.BlockLRU`` (the compiled build's LRU of a worker's blocks) against an ``OrderedDict`` under
    random sequences of every operation the index uses: the same answers, errors, order and stamps."""
    assert int(run(compiled_lib, ["-c", LRU_PROPERTY])) >= 17  # of 21 (operation, answered or raised)


@pytest.fixture(scope="module")
def recorded_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Routing traces recorded on the pure build (``tests/support/trace.py``), for the tests that replay."""
    trace = tmp_path_factory.mktemp("traces") / "trace.json"
    run(ROOT / "src", [str(TRACE), "record", str(trace), "--seed", "11", "--trials", "12", "--steps", "400"])
    return trace


def test_compiled_and_pure_builds_decide_alike_on_recorded_traces(
    compiled_lib: Path, recorded_trace: Path
) -> None:
    pure = run(ROOT / "src", [str(TRACE), "replay", str(recorded_trace)]).splitlines()
    compiled = run(compiled_lib, [str(TRACE), "replay", str(recorded_trace)]).splitlines()
    assert len(pure) == len(compiled)
    differing = [i for i, (a, b) in enumerate(zip(pure, compiled, strict=True)) if a != b]
    first = differing[:1]
    assert not differing, f"{len(differing)} steps differ, first: {[pure[i] for i in first]} vs " + str(
        [compiled[i] for i in first]
    )
    decisions = [json.loads(line) for line in pure if line.startswith('["route"')]
    assert len(decisions) > 1500
    assert {d[2] for d in decisions} >= {"prefix_hit", "load_balance", "load_fallback"}


MADE_INITS = """
import collections, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("recorded", sys.argv[1])
recorded = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recorded)
made = collections.Counter()

def watch(frame, event, arg):  # a dataclass-made __init__ of a class of a compiled module
    if event == "call" and frame.f_code.co_name == "__init__" and frame.f_code.co_filename == "<string>":
        cls = type(frame.f_locals.get("self"))
        module = sys.modules.get(cls.__module__)
        if (getattr(module, "__file__", None) or "").endswith(".so") and not cls.__dataclass_params__.frozen:
            made[cls.__qualname__] += 1

routes = 0
for trace in json.load(open(sys.argv[2])):
    replay = recorded.Replay(trace["seed"], trace["cap_tokens"], trace["workers"])
    sys.setprofile(watch)
    for event in trace["events"]:
        replay.act(event)  # the event without the router's summary (not a request's)
        routes += event["op"] == "route"
    sys.setprofile(None)
print(json.dumps({"routes": routes, "made": made}))
"""


def test_the_values_a_request_makes_have_compiled_inits(compiled_lib: Path, recorded_trace: Path) -> None:
    """mypyc compiles a written ``__init__`` but leaves a dataclass-made one interpreted (ten times
    slower): no dataclass of a compiled module is made with one on a request's way, once per ten requests
    or more, through the routing core (a recorded trace) or the edge. A frozen dataclass cannot have a
    written one (its fields refuse assignment) and is not counted."""
    found = json.loads(run(compiled_lib, ["-c", MADE_INITS, str(TRACE), str(recorded_trace)]))
    assert found["routes"] > 1500
    assert {name for name, count in found["made"].items() if count * 10 >= found["routes"]} == set()
    edge = (
        "import inspect\n"
        "from prefix_router.node.request import parse\n"
        "from prefix_router.proxy.edge import exchange\n"
        "from prefix_router.routing import types\n"
        "print([c.__name__ for c in (exchange.Opened, parse.Parsed, types.RouteRequest)"
        " if inspect.isfunction(c.__init__)])\n"
    )
    assert run(compiled_lib, ["-c", edge]).strip() == "[]"
    assert (
        run(ROOT / "src", ["-c", edge]).strip() == "['Opened', 'Parsed', 'RouteRequest']"
    )  # the check's own


def except_names(function: ast.AST) -> Iterator[tuple[str, str, int]]:
    """(name, exception type, line) of every ``except TYPE as name`` in ``function``'s own body (nested
    functions and classes are their own scopes)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.ExceptHandler) and node.name:
            yield node.name, ast.unparse(node.type) if node.type else "BaseException", node.lineno
        stack.extend(ast.iter_child_nodes(node))


def reused_except_names(source: str) -> list[str]:
    """Each ``except`` name a function binds to two exception types. mypyc gives a local one type, the
    first clause's: the second clause then raises ``TypeError`` at run time (seen: ``except InvalidRequest
    as exc`` then ``except Exception as exc`` turned a 400 into a 500 in the compiled build only)."""
    found = []
    for scope in ast.walk(ast.parse(source)):
        if isinstance(scope, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef):
            seen: dict[str, str] = {}
            for name, kind, line in sorted(except_names(scope), key=lambda clause: clause[2]):
                if seen.setdefault(name, kind) != kind:
                    found.append(f"line {line}: {name} is {seen[name]} and {kind}")
    return found


def test_reused_except_names_are_found() -> None:
    source = "try:\n    pass\nexcept KeyError as e:\n    pass\nexcept Exception as e:\n    pass\n"
    assert reused_except_names(source) == ["line 5: e is KeyError and Exception"]
    nested = "def f():\n    try:\n        pass\n    except KeyError as e:\n        pass\n    def g():\n"
    nested += "        try:\n            pass\n        except OSError as e:\n            pass\n"
    assert reused_except_names(nested) == []


def test_no_compiled_function_binds_one_except_name_to_two_types() -> None:
    reused = {path: reused_except_names((ROOT / path).read_text()) for path in compiled_paths()}
    assert {path: found for path, found in reused.items() if found} == {}
