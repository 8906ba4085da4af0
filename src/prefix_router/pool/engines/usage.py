"""Reading cached-prompt-token counts out of response bodies and final stream chunks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def dig(body: Mapping[str, Any], *path: str) -> Any:
    """``body[path[0]][path[1]]...``, or None as soon as a step is missing or not a mapping."""
    node: Any = body
    for key in path:
        if type(node) is not dict and (node is None or not isinstance(node, Mapping)):  # no ABC check
            return None
        node = node.get(key)
    return node


def count(value: Any) -> int | None:
    """A non-negative integer token count, or None (bools, strings, negatives, NaN and infinities are not
    counts; huge finite values are, and the routing core clamps them to the prompt)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value < 0 or not math.isfinite(value):
        return None
    return int(value)


def openai_cached_tokens(body: Mapping[str, Any]) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens``: the OpenAI field vLLM, SGLang and llama.cpp fill."""
    return count(dig(body, "usage", "prompt_tokens_details", "cached_tokens"))


def first_count(body: Mapping[str, Any], *paths: tuple[str, ...]) -> int | None:
    """The first of several field paths that holds a count."""
    for path in paths:
        value = count(dig(body, *path))
        if value is not None:
            return value
    return None
