"""The package's vLLM fleet (``support.vllm``): started at its first test, stopped after its last one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prefix_router.lab.launch.vllm import VllmFleet
from support.vllm import log_dir, start_fleet


@pytest.fixture(scope="package")
def vllm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmFleet]:
    """Two real vLLM instances shared by every module here (their start-ups are most of this package's
    time), stopped as soon as the package is done: idle, their workers still take CPU (about a quarter
    of a core each on this build), which the timing-sensitive tests after them must not share."""
    fleet = start_fleet(log_dir(tmp_path_factory))
    try:
        yield fleet
    finally:
        fleet.stop()
