"""Prefix routing against random routing on real llama.cpp engines (see llama_ab.py for the workload).

Runs in `make test` (the Makefile installs the llama venv first); it skips only when that venv is absent.
Takes about 75 s on 2 cores.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from prefix_router.lab.launch.llama_cpp import LlamaCppFleet


@pytest.mark.timeout(600)
async def test_prefix_routing_reuses_engine_cache_and_cuts_median_ttft(
    llama_fleet: LlamaCppFleet, ab: ModuleType
) -> None:
    workload = ab.Workload(prompts=6, rounds=2)
    await ab.warm_up(llama_fleet.urls, workload)
    results = await ab.compare(llama_fleet.urls, workload, seed=0)
    random_run, prefix_run = results["random"], results["prefix"]
    print("\n" + ab.table([random_run, prefix_run]))

    expected = len(workload.sequence())
    assert len(random_run.ttfts) == len(prefix_run.ttfts) == expected
    assert prefix_run.cached + prefix_run.evaluated == pytest.approx(random_run.cached + random_run.evaluated)
    assert prefix_run.reuse > random_run.reuse
    assert prefix_run.p50 < random_run.p50
