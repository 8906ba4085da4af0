"""Workload value types: what a workload yields, consumed by the benchmark runner and the simulator.

A workload is a list of sessions. A session is a sequence of turns sent one after the other: turn k+1 is
sent only after turn k's answer returns (closed within the session), with the history carried forward.
Single-shot requests are sessions of one turn. Arrival times are offsets in seconds from the start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefix_router.protocol import Endpoint


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session.

    chat: ``messages`` are appended to the history (which starts with the session's ``preamble``);
    when ``scripted_reply`` is set it is appended after the answer instead of the generated reply (agents'
    tool calls), otherwise the engine's generated reply is appended (multi-turn chat).
    completions: ``prompt`` is the whole prompt.
    ``body``: a complete recorded OpenAI request body (user traces), sent as is apart from ``model`` and the
    streaming options; the session history is then neither used nor extended.
    """

    max_tokens: int
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    scripted_reply: dict[str, Any] | None = None
    think_time_s: float = 0.0
    body: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    arrival_s: float
    turns: tuple[Turn, ...]
    endpoint: Endpoint = "chat"
    preamble: tuple[dict[str, Any], ...] = ()
    tools: tuple[dict[str, Any], ...] = ()
    tenant: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Workload:
    """``concurrency`` set means closed loop: at most that many sessions in flight, each starting as soon
    as a slot frees (``arrival_s`` then only orders them); None means open loop at the arrival times."""

    name: str
    sessions: tuple[Session, ...]
    description: str = ""
    concurrency: int | None = None

    @property
    def request_count(self) -> int:
        return sum(len(s.turns) for s in self.sessions)
