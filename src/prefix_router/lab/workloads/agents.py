"""Agents: a system prompt and a tool list per agent kind, then a loop of tool calls with growing outputs.

A session is one task: the user states it, then each step the assistant's tool call (scripted, appended
to the history as ``scripted_reply``) is answered by a tool output longer than the previous one; the
last turn lets the engine write the final answer. Every turn re-sends the whole growing history.
"""

from __future__ import annotations

import json
import random
from typing import Any

from prefix_router.lab.workloads.chatbots import zipf_weights
from prefix_router.lab.workloads.settings import WorkloadSettings
from prefix_router.lab.workloads.text import random_text, rng_for, tagged_text
from prefix_router.lab.workloads.types import Session, Turn

_TOOL_NAMES = ("search", "read_file", "run_query", "fetch_url", "list_items", "calculate")


class AgentSettings(WorkloadSettings):
    kinds: int = 4  # distinct agents (system prompt + tool list), Zipf popularity
    zipf_s: float = 1.0
    system_tokens: int = 512
    tools_per_kind: int = 4
    steps: int = 4  # tool calls per task; a session has steps + 1 turns
    task_tokens: int = 48
    tool_output_tokens: int = 96  # first tool output
    tool_output_growth: float = 1.5  # each tool output is this much longer than the previous one
    output_tokens: int = 32


def tool_schema(kind: int, index: int, seed: int) -> dict[str, Any]:
    name = f"{_TOOL_NAMES[index % len(_TOOL_NAMES)]}_{kind}_{index}"
    rng = rng_for("agent-tool", seed, kind, index)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": random_text(rng, 24),
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": random_text(rng, 8)}},
                "required": ["query"],
            },
        },
    }


def build(opts: AgentSettings, requests: int, seed: int) -> list[Session]:
    if opts.kinds < 1 or opts.tools_per_kind < 1 or opts.steps < 0:
        raise ValueError("kinds and tools_per_kind must be >= 1, steps >= 0")
    rng = random.Random(f"agents:{seed}")
    turns_per = opts.steps + 1
    count = -(-requests // turns_per)
    picks = rng.choices(range(opts.kinds), weights=zipf_weights(opts.kinds, opts.zipf_s), k=count)
    sessions = [_session(i, kind, opts, seed, rng) for i, kind in enumerate(picks)]
    return _trim(sessions, requests)


def _trim(sessions: list[Session], requests: int) -> list[Session]:
    extra = sum(len(s.turns) for s in sessions) - requests
    if extra > 0 and sessions:
        last = sessions[-1]
        sessions[-1] = Session(
            last.session_id, 0.0, last.turns[:-extra], preamble=last.preamble, tools=last.tools
        )
    return [s for s in sessions if s.turns]


def _session(index: int, kind: int, opts: AgentSettings, seed: int, rng: random.Random) -> Session:
    system = tagged_text(f"agent {kind} system", rng_for("agent-system", seed, kind), opts.system_tokens)
    tools = tuple(tool_schema(kind, t, seed) for t in range(opts.tools_per_kind))
    return Session(
        session_id=f"agent-{index}",
        arrival_s=0.0,
        turns=_turns(index, tools, opts, rng),
        preamble=({"role": "system", "content": system},),
        tools=tools,
        tenant=f"agent-{kind}",
    )


def _turns(
    index: int, tools: tuple[dict[str, Any], ...], opts: AgentSettings, rng: random.Random
) -> tuple[Turn, ...]:
    task = {"role": "user", "content": f"Task {index}: {random_text(rng, opts.task_tokens)}."}
    messages: list[dict[str, Any]] = [task]
    turns: list[Turn] = []
    for step in range(opts.steps):
        call = tool_call(f"call_{index}_{step}", tools[rng.randrange(len(tools))], rng)
        turns.append(Turn(max_tokens=opts.output_tokens, messages=tuple(messages), scripted_reply=call))
        size = round(opts.tool_output_tokens * opts.tool_output_growth**step)
        messages = [
            {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": random_text(rng, size)}
        ]
    turns.append(Turn(max_tokens=opts.output_tokens, messages=tuple(messages)))
    return tuple(turns)


def tool_call(call_id: str, tool: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The assistant message calling ``tool`` (as the engine would have generated it)."""
    arguments = json.dumps({"query": random_text(rng, 8)})
    function = {"name": tool["function"]["name"], "arguments": arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }
