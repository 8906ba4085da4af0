"""The benchmark scripts (``benchmarks/*.py``, not a package) loaded as modules, for the tests of their
table and verdict code."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextmanager
def benchmark_module(filename: str) -> Iterator[ModuleType]:
    """``benchmarks/<filename>`` imported under a name of its own, registered in ``sys.modules`` while in
    use (its dataclasses look their module up) and removed after."""
    name = f"benchmark_{Path(filename).stem}"
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]
