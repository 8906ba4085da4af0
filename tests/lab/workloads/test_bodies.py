from __future__ import annotations

from prefix_router.lab.workloads.bodies import request_body
from prefix_router.lab.workloads.types import Session, Turn


def test_completions_body_carries_prompt_and_extra_body() -> None:
    turn = Turn(max_tokens=3, prompt="hello")
    session = Session("s", 0.0, (turn,), endpoint="completions", extra_body={"temperature": 0.0})
    assert request_body(session, turn, [], "m") == {"temperature": 0.0, "model": "m", "max_tokens": 3,
                                                   "prompt": "hello"}  # fmt: skip


def test_chat_body_appends_turn_to_history_and_lists_tools() -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    turn = Turn(max_tokens=2, messages=({"role": "user", "content": "q"},))
    session = Session("s", 0.0, (turn,), tools=(tool,))
    history = [{"role": "system", "content": "s"}]
    body = request_body(session, turn, history, "m")
    assert body["messages"] == [*history, {"role": "user", "content": "q"}] and body["tools"] == [tool]
    assert history == [{"role": "system", "content": "s"}]


def test_recorded_body_keeps_its_own_model() -> None:
    turn = Turn(max_tokens=1, body={"model": "own", "prompt": "p"})
    session = Session("s", 0.0, (turn,), endpoint="completions")
    assert request_body(session, turn, [], "m") == {"model": "own", "prompt": "p"}
