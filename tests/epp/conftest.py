"""Fixtures: ``gateway``, a real Envoy in front of a real endpoint picker in front of test engines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from support.gateway import Gateways


@pytest.fixture
async def gateways(tmp_path: Path) -> AsyncIterator[Gateways]:
    started = Gateways(tmp_path)
    try:
        yield started
    finally:
        await started.close()
