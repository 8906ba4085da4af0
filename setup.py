"""Build switch: pure Python by default; ``COMPILE_ROUTING_CORE=1`` compiles the routing core and the
proxy's request path.

Compiled (the release build: the Docker image builds it; CI builds it too, runs the tests of what it
compiles on it and ``bench-overhead`` on both builds, ``tests/lab/bench/test_overhead.py``): mypyc over
``COMPILED`` (the modules a routed request runs through: the routing core's hot modules, the proxy's edge,
the upstream client, the pool, the app's state, metrics and log handlers; from the same typed source) and
the C of ``prefix_router.routing._chain`` (chained xxh3 block hashes in one pass, through the system's
libxxhash; a text key's bytes counted by class) and ``prefix_router.routing._lru`` (the prefix index's
LRU of a worker's blocks, unboxed, and its touch of one chain). Pure (the default, and what an editable
developer install gets, where compiled modules would shadow edits): no extension at all. A part that
cannot be built (no C compiler, no mypyc, no libxxhash) is left out with a warning and its pure-Python
module stands in: every compiled module ships its source beside it, and ``hashing``, ``units`` and
``index`` use the C only when it imports.

What mypyc needs of a compiled module: a subclass of an interpreted class marked
``mypyc_attr(native_class=False)`` and its base imported by its own module (``logging``), or
kept in an uncompiled module (aiohttp's response classes: ``proxy/edge/responses.py``); a value of the
declared type everywhere (mypyc checks them at run time: enums, not their strings); one exception type per
``except ... as name`` in a function (``tests/test_build.py`` checks it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
ROUTING = "src/prefix_router/routing"
EDGE = "src/prefix_router/proxy/edge"
NODE = "src/prefix_router/node"
CHAIN = "prefix_router.routing._chain"
LRU = "prefix_router.routing._lru"
# The hot path of a routed request (profiled with benchmarks/route_core.py). Pydantic settings classes stay
# in uncompiled modules (routing/settings.py, the policies' *Settings): compiled, their constraints are lost.
CORE = (
    "bounded",
    "feedback",
    "hashing",
    "index",
    "keys",
    "canonical",
    "units",
    "load",
    "backlog",
    "latency",
    "placement",
    "router",
    "types",
    "policies/base",
    "policies/prefix",
    "policies/ttft",
)
# The proxy's request path (profiled served: bench-overhead --profile). Its subclasses of aiohttp's classes
# stay in uncompiled modules (edge/responses.py, node/control/http_errors.py): mypyc cannot build them.
EDGE_PATH = (
    "exchange",
    "handlers",
    "head",
    "request",
)
# The node's request steps and parts that every routed request runs, whatever carries it.
NODE_PATH = (
    "request/access",
    "request/auth",
    "request/deadlines",
    "request/errors",
    "request/forward",
    "request/parse",
    "request/sse",
    "steps/accounting",
    "steps/admission",
    "steps/choice",
    "steps/keying",
)
# What the request path calls beyond the edge and the steps: the upstream client, the pool, the node's
# state, the access log's handler, metrics; and with several processes (``serve --processes``) the channel
# that shares their view (its index changes encoded, merged, sent and applied).
BEYOND = (
    "node/upstream/http_client",
    "proxy/run/lean",
    "pool/engines/usage",
    "pool/pool",
    "pool/worker",
    "node/state",
    "node/telemetry/logs",
    "node/telemetry/metrics",
    "replication/codec",
    "replication/coalesce",
    "replication/outbox",
    "replication/local",
)
COMPILED = (
    [f"{ROUTING}/{name}.py" for name in CORE]
    + [f"{EDGE}/{name}.py" for name in EDGE_PATH]
    + [f"{NODE}/{name}.py" for name in NODE_PATH]
    + [f"src/prefix_router/{name}.py" for name in BEYOND]
)


def compiling() -> bool:
    return os.environ.get("COMPILE_ROUTING_CORE", "") == "1"


def chain_extension() -> Extension:
    # libxxhash0 (Debian/Ubuntu: also a dependency of apt) ships the shared library; its header is not
    # needed: _chain.c declares the one published function it calls.
    return Extension(
        CHAIN,
        sources=[f"{ROUTING}/_chain.c"],
        extra_compile_args=["-O3"],  # -O3: the byte-class loop is vectorised
        extra_link_args=["-l:libxxhash.so.0"],
    )


def lru_extension() -> Extension:
    return Extension(LRU, sources=[f"{ROUTING}/_lru.c"], extra_compile_args=["-O2"])


def ext_modules() -> list[Extension]:
    if not compiling():
        return []
    extensions = [chain_extension(), lru_extension()]
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("prefix-router: mypyc not installed, the routing core stays pure Python", file=sys.stderr)
        return extensions
    return extensions + list(mypycify(COMPILED, opt_level="3", multi_file=False))


class OptionalBuildExt(build_ext):
    """Builds each part it can. A failed part (no compiler, no libxxhash) leaves its pure module; the mypyc
    modules are all or nothing (they share one runtime library, built first)."""

    def run(self) -> None:
        self.mypyc_failed = False
        try:
            super().run()
        except Exception as error:  # a failed compile must not fail the install
            self.warn_or_raise(f"compiled core not built ({error}); pure Python")

    def build_extension(self, ext: Extension) -> None:
        mypyc = ext.name not in (CHAIN, LRU)
        if mypyc and self.mypyc_failed:
            return
        try:
            super().build_extension(ext)
        except Exception as error:
            self.mypyc_failed = self.mypyc_failed or mypyc
            self.warn_or_raise(f"{ext.name} not built ({error}); the pure modules stand in")

    def warn_or_raise(self, message: str) -> None:
        print(f"prefix-router: {message}", file=sys.stderr)
        if os.environ.get("COMPILE_ROUTING_CORE_STRICT", "") == "1":  # the test's build: all or fail
            raise RuntimeError(message)


if __name__ == "__main__":  # setuptools runs it so; tests/test_build.py reads COMPILED only
    os.chdir(ROOT)
    setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
