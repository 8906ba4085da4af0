"""The OpenAI request body of a workload turn, shared by the benchmark runner and the simulator."""

from __future__ import annotations

from typing import Any

from prefix_router.lab.workloads.types import Session, Turn


def request_body(session: Session, turn: Turn, history: list[dict[str, Any]], model: str) -> dict[str, Any]:
    """The OpenAI body of ``turn`` given the session's ``history`` so far."""
    if turn.body is not None:
        return {**turn.body, "model": turn.body.get("model") or model}
    body: dict[str, Any] = {**session.extra_body, "model": model, "max_tokens": turn.max_tokens}
    if session.endpoint == "completions":
        body["prompt"] = turn.prompt or ""
        return body
    body["messages"] = [*history, *turn.messages]
    if session.tools:
        body["tools"] = list(session.tools)
    return body
