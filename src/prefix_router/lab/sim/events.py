"""The discrete-event loop: a time-ordered queue of events, one small class per kind (as Vidur).

Ties are broken by insertion order, so a run is deterministic. Events call back into the simulation
(``SimulationHooks``); they hold no state of their own beyond what they need to act.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from prefix_router.lab.sim.requests import SimRequest

if TYPE_CHECKING:
    from prefix_router.lab.sim.pd_sim import Stage


class SimulationHooks(Protocol):
    def on_arrival(self, request: SimRequest, now: float) -> None: ...

    def on_engine_step(self, instance: int, version: int, now: float) -> None: ...

    def on_scrape(self, now: float) -> None: ...

    def on_fault(self, fault: Fault, now: float) -> None: ...

    def on_handoff(self, stage: Stage, now: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Fault:
    """An engine fault at a simulated time: ``restart`` (a new engine process: its cached blocks and its
    event sequence start over) or ``reset`` (``/reset_prefix_cache``)."""

    instance: int
    kind: str  # "restart" | "reset"


class Event:
    __slots__ = ()

    def handle(self, sim: SimulationHooks, now: float) -> None:
        raise NotImplementedError


class RequestArrival(Event):
    """A request reaches the router."""

    __slots__ = ("request",)

    def __init__(self, request: SimRequest) -> None:
        self.request = request

    def handle(self, sim: SimulationHooks, now: float) -> None:
        sim.on_arrival(self.request, now)


class EngineStepEnd(Event):
    """An engine finishes its current step (or decode span); stale when the engine re-planned since."""

    __slots__ = ("instance", "version")

    def __init__(self, instance: int, version: int) -> None:
        self.instance = instance
        self.version = version

    def handle(self, sim: SimulationHooks, now: float) -> None:
        sim.on_engine_step(self.instance, self.version, now)


class MetricsScrape(Event):
    """The router scrapes every engine's load (queue depth, KV usage), as the proxy's pool does."""

    __slots__ = ()

    def handle(self, sim: SimulationHooks, now: float) -> None:
        sim.on_scrape(now)


@dataclass(slots=True)
class EventQueue:
    """A min-heap of (time, sequence, event); bounded by ``capacity`` pending events."""

    capacity: int = 10_000_000
    _heap: list[tuple[float, int, Event]] = field(default_factory=list)
    _seq: int = 0

    def push(self, time: float, event: Event) -> None:
        if len(self._heap) >= self.capacity:
            raise OverflowError(f"more than {self.capacity} pending events")
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, event))

    def pop(self) -> tuple[float, Event]:
        time, _, event = heapq.heappop(self._heap)
        return time, event

    def __len__(self) -> int:
        return len(self._heap)


class EngineFault(Event):
    """An engine restarts or has its prefix cache reset (``Fault``)."""

    __slots__ = ("fault",)

    def __init__(self, fault: Fault) -> None:
        self.fault = fault

    def handle(self, sim: SimulationHooks, now: float) -> None:
        sim.on_fault(self.fault, now)


class KvHandoff(Event):
    """A prefill stage's KV cache has reached its decode engine (after the transfer time)."""

    __slots__ = ("stage",)

    def __init__(self, stage: Stage) -> None:
        self.stage = stage

    def handle(self, sim: SimulationHooks, now: float) -> None:
        sim.on_handoff(self.stage, now)
