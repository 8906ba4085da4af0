"""Runs an ``EngineModel`` in real time on the asyncio loop, for the HTTP engine.

Virtual engine time is wall time divided by ``time_scale`` (0.1 runs ten times faster than the model).
The driver sleeps until the engine's current step or span ends, completes it and wakes the requests whose
state changed. Decode spans are capped (``tick_s`` of wall time) so tokens stream at the decode pace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from prefix_router.lab.sim.engine import EngineEvent, EngineModel, EngineRequest


@dataclass(slots=True, eq=False)
class Ticket:
    """What a request handler watches: progress of one engine request."""

    request_id: str
    changed: asyncio.Event
    started: bool = False
    cached_tokens: int = 0
    generated: int = 0
    done: bool = False


@dataclass(slots=True)
class _State:
    tickets: dict[str, Ticket] = field(default_factory=dict)
    decoding: dict[str, Ticket] = field(default_factory=dict)


class EngineDriver:
    def __init__(self, engine: EngineModel, time_scale: float) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.engine = engine
        self.time_scale = time_scale
        self._state = _State()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._origin = 0.0
        self.on_step: Callable[[], None] | None = None  # after every engine step (the KV events' flush)

    def now(self) -> float:
        """Current virtual engine time (seconds)."""
        return (asyncio.get_running_loop().time() - self._origin) / self.time_scale

    async def start(self) -> None:
        self._origin = asyncio.get_running_loop().time()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, req: EngineRequest, changed: asyncio.Event) -> Ticket:
        """Queue a request now (raises ``RequestRejected``)."""
        self._catch_up()
        self.engine.submit(req, self.now())
        ticket = Ticket(req.request_id, changed)
        self._state.tickets[req.request_id] = ticket
        self._wake.set()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Abort a request whose client went away."""
        if ticket.done:
            return
        self._catch_up()
        self.engine.cancel(ticket.request_id, self.now())
        self._forget(ticket)
        ticket.done = True
        self._wake.set()

    def live(self) -> int:
        return len(self._state.tickets)

    def _forget(self, ticket: Ticket) -> None:
        self._state.tickets.pop(ticket.request_id, None)
        self._state.decoding.pop(ticket.request_id, None)

    def _catch_up(self) -> None:
        now = self.now()
        while (end := self.engine.next_time()) is not None and end <= now:
            self._advance()

    async def _run(self) -> None:
        while True:
            end = self.engine.next_time()
            self._wake.clear()
            if end is None:
                await self._wake.wait()
                continue
            delay = (end - self.now()) * self.time_scale
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                continue
            self._advance()

    def _advance(self) -> None:
        self._deliver(self.engine.advance())
        if self.on_step is not None:
            self.on_step()

    def _deliver(self, events: list[EngineEvent]) -> None:
        for event in events:
            self._on_event(event)
        for rid, ticket in self._state.decoding.items():
            generated = self.engine.generated(rid)
            if generated > ticket.generated:
                ticket.generated = generated
                ticket.changed.set()

    def _on_event(self, event: EngineEvent) -> None:
        ticket = self._state.tickets.get(event.request_id)
        if ticket is None:
            return
        ticket.started = True
        ticket.cached_tokens = event.cached_tokens
        ticket.generated = max(ticket.generated, event.generated)
        if event.kind == "finished":
            ticket.done = True
            self._forget(ticket)
        else:
            self._state.decoding[event.request_id] = ticket
        ticket.changed.set()
