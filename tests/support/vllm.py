"""Real vLLM engines for the end-to-end tests: one fleet per test session (``vllm_fleet`` fixture in
tests/e2e/conftest.py), shared by every test that needs it.

Two instances of the CPU build (``make vllm``), one core each, small caches (``CACHE_TOKENS``: 64 blocks
of 128 tokens, so a test can fill one) and KV cache events on (so the precise-mode tests can subscribe
to the same engines; the config a router needs is ``workers_config``). SmolLM2-135M with its own weights
(dequantized from the GGUF). A missing venv fails the tests that need it: ``make test`` installs it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from prefix_router.lab.launch.vllm import VllmFleet, VllmSettings, unavailable_reason

INSTANCES = 2
CACHE_TOKENS = 8192
MODEL = "smollm2-135m"


def fleet_settings(log_dir: Path) -> VllmSettings:
    return VllmSettings(
        instances=INSTANCES,
        kv_cache_tokens=CACHE_TOKENS,
        max_model_len=4096,
        max_num_seqs=8,
        kv_events=True,
        log_dir=log_dir,
    )


def require_vllm_venv() -> None:
    reason = unavailable_reason()
    if reason is not None:  # make test installs it (make vllm): missing is a failure, never a skip
        pytest.fail(reason)


def start_fleet(log_dir: Path) -> VllmFleet:
    require_vllm_venv()
    fleet = VllmFleet(fleet_settings(log_dir))
    fleet.start()
    return fleet


def workers_config(fleet: VllmFleet, events: bool = False) -> list[dict[str, Any]]:
    """``workers:`` entries for a router in front of the fleet (``events``: with ``kv_events``)."""
    workers = []
    for instance in fleet.instances:
        worker: dict[str, Any] = {"url": instance.url, "name": f"vllm-{instance.index}", "engine": "vllm"}
        if events and instance.events_endpoint is not None:
            worker["kv_events"] = {"endpoint": instance.events_endpoint, "bind": True, "topic": "kv"}
        workers.append(worker)
    return workers


def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the engines' logs go (``PREFIX_ROUTER_VLLM_TEST_LOGS`` keeps them somewhere known)."""
    given = os.environ.get("PREFIX_ROUTER_VLLM_TEST_LOGS")
    return Path(given) if given else tmp_path_factory.mktemp("vllm-logs")
