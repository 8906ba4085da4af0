"""Replaying the benchmark workloads (``prefix_router.lab.workloads``) in the simulator.

Each turn becomes the OpenAI body the benchmark runner would send (history carried forward, the
engine's generated reply appended for the next turn unless the turn scripts one). The router's view is
``keys.KeyBuilder.build`` of that body, exactly as the proxy computes it; the engine's view is the
simulated engine's own parsing and chat template (``openai_api.parse``), exactly as ``engine-sim``
computes it. Replies are the engine's deterministic pseudo-words, known before the request runs, so the
extension blocks given to the router are those of the real reply. Sessions run their turns one after the
other (think time included); open-loop sessions start at their arrival times, closed-loop workloads keep
``concurrency`` sessions in flight.

Session ids are passed to the router only when ``sessions`` is set (as the benchmark runner's session
header would): the router's session affinity then overrides every policy for later turns, ``random``
included, so by default policies are compared on their own.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prefix_router.lab.sim.openai_api import EngineLimits, parse
from prefix_router.lab.sim.requests import SimRequest
from prefix_router.lab.sim.text import ids_text
from prefix_router.lab.workloads.bodies import request_body
from prefix_router.lab.workloads.types import Session, Workload
from prefix_router.routing import KeyBuilder, RoutingSettings


def scale_arrivals(workload: Workload, rate_scale: float) -> Workload:
    """Arrival times divided by ``rate_scale`` (2.0 sends twice as fast)."""
    if rate_scale <= 0:
        raise ValueError("rate_scale must be positive")
    if rate_scale == 1.0:
        return workload
    sessions = tuple(dataclasses.replace(s, arrival_s=s.arrival_s / rate_scale) for s in workload.sessions)
    return dataclasses.replace(workload, sessions=sessions)


@dataclass(slots=True)
class _SessionState:
    session: Session
    history: list[dict[str, Any]]
    turn: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    reply: dict[str, Any] = field(default_factory=dict)


class WorkloadSource:
    """A ``RequestSource`` over a benchmark workload."""

    def __init__(
        self, workload: Workload, routing: RoutingSettings, limits: EngineLimits, sessions: bool = False
    ) -> None:
        self.workload = workload
        self.sessions = sessions
        self.keys = KeyBuilder(routing.keys)
        self.limits = limits
        self.engine_block_tokens = limits.block_tokens
        self.total = workload.request_count
        self._states: dict[str, _SessionState] = {}
        self._queued: deque[Session] = deque()

    def initial(self) -> Iterator[SimRequest]:
        sessions = self.workload.sessions
        slots = self.workload.concurrency
        if slots is None:
            yield from (self._start(s, s.arrival_s) for s in sessions)
            return
        self._queued = deque(sessions[slots:])
        yield from (self._start(s, 0.0) for s in sessions[:slots])

    def followups(self, done: SimRequest, now: float, ok: bool = True) -> list[SimRequest]:
        assert done.session is not None
        state = self._states[done.session]
        if ok and state.turn + 1 < len(state.session.turns):
            self._record_turn(state)
            state.turn += 1
            turn = state.session.turns[state.turn]
            return [self._request(state, now + turn.think_time_s)]
        del self._states[done.session]
        if self._queued:
            return [self._start(self._queued.popleft(), now)]
        return []

    def _start(self, session: Session, arrival: float) -> SimRequest:
        state = _SessionState(session, list(session.preamble))
        self._states[session.session_id] = state
        return self._request(state, arrival + session.turns[0].think_time_s)

    def _record_turn(self, state: _SessionState) -> None:
        turn = state.session.turns[state.turn]
        if turn.body is None:
            state.history.extend(turn.messages)
            state.history.append(turn.scripted_reply or state.reply)

    def _request(self, state: _SessionState, arrival: float) -> SimRequest:
        session, turn = state.session, state.session.turns[state.turn]
        rid = f"{session.session_id}#{state.turn}"
        body = request_body(session, turn, state.history, self.limits.model)
        endpoint = session.endpoint
        multi = session.session_id if self.sessions and len(session.turns) > 1 else None
        route = self.keys.build(endpoint, body, route_id=rid, tenant=session.tenant, session=multi)
        generation = parse(endpoint, body, self.limits, rid).generations[0]
        text = ids_text(generation.output)
        state.reply = {"role": "assistant", "content": text}
        generated = state.reply if endpoint == "chat" else {"text": text}
        extension = self.keys.extension(endpoint, body, generated, tenant=session.tenant)
        engine = dataclasses.replace(generation.request, request_id=rid)
        return SimRequest(route, engine, arrival, extension, session.session_id, state.turn)
