"""``benchmarks/epp.py``'s plan: part 2 in front of simulated engines (the default) or real vLLM ones
(``--engines vllm``, ``VllmFleet``); only the arguments and the plan here, no engine is started."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from prefix_router.lab.launch.vllm import VllmFleet

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "epp.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("epp_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_simulated_engines_by_default(bench: ModuleType, tmp_path: Path) -> None:
    args = bench.parse_args([])
    plan = bench.engine_plan(args)
    assert plan.simulated and plan.instances == 4 and "simulated" in plan.describe()
    argv = bench.bench_argv("http://127.0.0.1:1", ["http://e"], "serve", args, tmp_path / "o.json")
    assert "--simulated" in argv


def test_vllm_engines_two_real_instances(bench: ModuleType, tmp_path: Path) -> None:
    args = bench.parse_args(["--engines", "vllm", "--skip-data-path", "--hit-requests", "50"])
    plan = bench.engine_plan(args)
    assert not plan.simulated and plan.instances == 2 and "real vLLM" in plan.describe()
    argv = bench.bench_argv("http://127.0.0.1:1", ["http://e"], "serve", args, tmp_path / "o.json")
    assert "--simulated" not in argv and argv[argv.index("--requests") + 1] == "50"
    settings = plan.vllm_settings(tmp_path)
    assert settings.instances == 2 and settings.log_dir == tmp_path
    fleet = VllmFleet(settings)  # validated as the run would build it; nothing started
    assert fleet.urls == []


def test_instances_and_engine_kind_checked(bench: ModuleType) -> None:
    assert bench.engine_plan(bench.parse_args(["--engines", "vllm", "--instances", "3"])).instances == 3
    with pytest.raises(SystemExit):
        bench.parse_args(["--engines", "sglang"])
