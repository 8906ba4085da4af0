"""The benchmark tests' engines: the shared fake engine (``support.engines``) over real HTTP, with the
flags of ``BENCH_ENGINE``: it streams SSE like an engine, reports ``cached_tokens`` from a toy prefix cache
(characters / 4 of the longest prefix shared with any earlier prompt), names itself in
``x-prefix-router-worker``, answers 500 with an OpenAI error body to prompts containing ``FAIL``, counts
its answers in ``/metrics`` and records every body and header it received.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from support.engines import BENCH_ENGINE, FakeEngine


@pytest.fixture
async def fake_pair(fake_engine: Callable[..., Awaitable[FakeEngine]]) -> list[FakeEngine]:
    """Two fake engines, for the harness (router in front)."""
    return [await fake_engine(f"fake-{i}", **BENCH_ENGINE) for i in range(2)]


@pytest.fixture
async def fake_openai(fake_engine: Callable[..., Awaitable[FakeEngine]]) -> FakeEngine:
    return await fake_engine("fake-0", **BENCH_ENGINE)
