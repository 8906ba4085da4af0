"""Real-engine end-to-end fixtures: llama.cpp instances from the llama venv (scripts/install-llama-cpp.sh),
one fleet per module that uses it. The vLLM fleet is the ``vllm/`` package's (its conftest)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from prefix_router.lab.launch.llama_cpp import LlamaCppFleet, unavailable_reason
from support import needs


def load_harness() -> ModuleType:
    """``llama_ab.py`` (also a benchmark script) as a module, without putting tests/ on sys.path."""
    name = "prefix_router_e2e_llama_ab"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("llama_ab.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def require_llama_venv() -> None:
    needs.require("engine")
    reason = unavailable_reason()
    if reason is not None:  # make test installs it (make llama): missing is a failure, never a skip
        pytest.fail(reason)


@pytest.fixture
def ab() -> ModuleType:
    """The A/B harness module (``llama_ab.py``)."""
    return load_harness()


@pytest.fixture
def llama_venv() -> None:
    """Skip, with the reason, when the llama venv is absent."""
    require_llama_venv()


@pytest.fixture(scope="module")
def llama_fleet() -> Iterator[LlamaCppFleet]:
    """Three single-thread instances with a ~4-state RAM prompt cache each, stopped after the module."""
    require_llama_venv()
    with LlamaCppFleet(load_harness().fleet_settings(instances=3)) as fleet:
        yield fleet
