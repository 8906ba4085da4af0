"""Router fixtures: a real router app on 127.0.0.1 in front of fake engines (``support.routers``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from support.routers import RouterFactory, Routers


@pytest.fixture
async def start_router() -> AsyncIterator[RouterFactory]:
    """``await start_router(engine_a, engine_b, settings={"retries.max_attempts": 2}, upstream=...)``."""
    routers = Routers()
    try:
        yield routers.start
    finally:
        await routers.close()
