"""Shared fixtures for the simulator tests (helpers are exposed through the ``kit`` fixture, since test
modules are imported with ``--import-mode=importlib`` and cannot import this file)."""

from __future__ import annotations

import pytest
import xxhash

from prefix_router.lab.sim.engine import EngineModel, EngineRequest
from prefix_router.lab.sim.profiles import EngineProfile, get_profile

Event = tuple[str, str, float, int]


class Kit:
    @staticmethod
    def chain(prefix: str, count: int, start: int = 0) -> tuple[int, ...]:
        """Distinct fake block hashes: ``chain("a", 3)`` shares nothing with ``chain("b", 3)``."""
        return tuple(xxhash.xxh3_64_intdigest(f"{prefix}/{i}".encode()) for i in range(start, start + count))

    @staticmethod
    def request(
        rid: str, blocks: tuple[int, ...], block_tokens: int, output: int = 4, extra: int = 8
    ) -> EngineRequest:
        """A request whose prompt is ``blocks`` full blocks plus ``extra`` tokens."""
        return EngineRequest(rid, len(blocks) * block_tokens + extra, output, blocks)

    @staticmethod
    def run_until_idle(engine: EngineModel, limit: int = 100_000) -> list[Event]:
        """Advance until the engine is idle; returns (kind, request id, time, cached tokens) events."""
        events: list[Event] = []
        for _ in range(limit):
            if engine.next_time() is None:
                return events
            events.extend((e.kind, e.request_id, e.time, e.cached_tokens) for e in engine.advance())
        raise AssertionError("engine did not go idle")

    @staticmethod
    def run_one(engine: EngineModel, req: EngineRequest, now: float) -> tuple[float, float, int]:
        """Submit ``req`` at ``now`` on an idle engine and run it: (ttft, end time, cached tokens)."""
        engine.submit(req, now)
        events = Kit.run_until_idle(engine)
        first = next(e for e in events if e[0] == "first_token" and e[1] == req.request_id)
        done = next(e for e in events if e[0] == "finished" and e[1] == req.request_id)
        return first[2] - now, done[2], done[3]


@pytest.fixture
def kit() -> type[Kit]:
    return Kit


@pytest.fixture
def demo_profile() -> EngineProfile:
    return get_profile("cpu-demo")
