"""Shared fixtures for the simulator tests (helpers through the ``kit`` fixture: ``support.kits.SimKit``)."""

from __future__ import annotations

import pytest

from prefix_router.lab.sim.profiles import EngineProfile, get_profile
from support.kits import SimKit


@pytest.fixture
def kit() -> type[SimKit]:
    return SimKit


@pytest.fixture
def demo_profile() -> EngineProfile:
    return get_profile("cpu-demo")
