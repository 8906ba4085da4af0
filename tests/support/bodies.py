"""Chat completion request bodies as the tests send them: ``chat`` of any messages, ``ask`` of one user
turn after an optional system prompt, and ``turns``, those messages alone."""

from __future__ import annotations

from typing import Any

MODEL = "m"  # the model every fake engine serves


def turns(user: Any, system: str | None = None) -> list[dict[str, Any]]:
    """A user turn whose ``content`` is ``user`` as given (text or a list of parts), after a system turn
    when ``system`` is given."""
    prompt = [] if system is None else [{"role": "system", "content": system}]
    return [*prompt, {"role": "user", "content": user}]


def chat(messages: list[dict[str, Any]], model: str = MODEL, **fields: Any) -> dict[str, Any]:
    """A ``/v1/chat/completions`` body: ``model``, ``messages``, then ``fields`` (sampling, ``stream``,
    ``tools``, ...), in that order."""
    return {"model": model, "messages": messages, **fields}


def ask(user: Any, system: str | None = None, model: str = MODEL, **fields: Any) -> dict[str, Any]:
    """``chat`` of ``turns(user, system)``."""
    return chat(turns(user, system), model, **fields)
