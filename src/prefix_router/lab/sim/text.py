"""The simulated engine's tokenizer, chat template and text generator (deterministic, approximate).

Tokenizer: one token per 4 characters of text, cut from the start of the rendered prompt, so a text
prefix is a token prefix (``token_count = ceil(len / 4)``); a block of 16 tokens is 64 characters. Real
tokenizers average about 4 characters per token on English text. Prompts given as token ids are used as is.
A token's id (``text_ids``, for the render and tokenize endpoints) is a hash of its 4 characters in
``[0, VOCAB_SIZE)``: equal texts give equal ids in every engine process, and a text prefix an id prefix.

Chat template: messages are rendered one after the other, each as ``<|role|>\\n...<|end|>\\n`` (tools first,
as templates put them in the system part), followed by the generation prompt ``<|assistant|>\\n``. An
assistant message renders as the generation prompt + its content + ``<|end|>\\n``, so the prompt of turn k
plus the reply generated for it is an exact prefix of the prompt of turn k+1: the cached prefix grows
across turns, as with real chat templates.

Generation: pseudo-words of exactly 4 characters (one token each), chosen by a generator seeded with the
prompt's hash, so the same prompt always yields the same reply.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import xxhash

CHARS_PER_TOKEN = 4
VOCAB_SIZE = 128_256  # ids of text tokens lie in [0, VOCAB_SIZE) (Llama 3's vocabulary size)
_MIX = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5], np.uint64)
END = "<|end|>\n"
GENERATION_PROMPT = "<|assistant|>\n"
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
SYLLABLES = tuple(f" {a}{v}{b}" for a in _CONSONANTS for v in _VOWELS for b in "lnrs")


def token_count(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def text_ids(text: str) -> list[int]:
    """The token ids of ``text``: one per 4 characters (the last token may be shorter), deterministic."""
    if not text:
        return []
    points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.uint64)
    padded = np.zeros(-(-len(points) // CHARS_PER_TOKEN) * CHARS_PER_TOKEN, dtype=np.uint64)
    padded[: len(points)] = points + 1  # + 1: a short last token differs from one padded with NUL
    h = (padded.reshape(-1, CHARS_PER_TOKEN) * _MIX).sum(axis=1, dtype=np.uint64)
    h ^= h >> np.uint64(31)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(29)
    return (h % np.uint64(VOCAB_SIZE)).astype(np.int64).tolist()  # type: ignore[no-any-return]


def text_pieces(text: str) -> list[str]:
    """The text of each token of ``text`` (what ``text_ids`` hashes)."""
    return [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]


def namespace_seed(model: str, salt: str | None = None) -> int:
    """The seed of the first block: requests for different models or cache salts never share blocks."""
    return xxhash.xxh3_64_intdigest(f"{model}\x00{salt or ''}".encode())


def text_blocks(text: str, block_tokens: int, seed: int) -> tuple[int, ...]:
    """Chained hashes of the full token blocks of ``text``."""
    width = block_tokens * CHARS_PER_TOKEN
    out: list[int] = []
    digest = xxhash.xxh3_64_intdigest
    h = seed
    for start in range(0, len(text) - width + 1, width):
        h = digest(text[start : start + width].encode(), seed=h)
        out.append(h)
    return tuple(out)


def id_blocks(ids: Sequence[int], block_tokens: int, seed: int) -> tuple[int, ...]:
    """Chained hashes of the full blocks of a token-id sequence."""
    out: list[int] = []
    h = seed
    for start in range(0, len(ids) - block_tokens + 1, block_tokens):
        h = xxhash.xxh3_64_intdigest(array("q", ids[start : start + block_tokens]).tobytes(), seed=h)
        out.append(h)
    return tuple(out)


def generate_ids(seed: int, count: int) -> list[int]:
    """``count`` pseudo-token ids (indexes into ``SYLLABLES``), deterministic in ``seed``."""
    rng = random.Random(seed)
    n = len(SYLLABLES)
    return [rng.randrange(n) for _ in range(count)]


def ids_text(ids: Sequence[int]) -> str:
    return "".join(SYLLABLES[i] for i in ids)


def natural_length(seed: int, low: int = 16, high: int = 256) -> int:
    """The reply length when the request sets no max_tokens (as if the model emitted end-of-sequence)."""
    return low + seed % (high - low + 1)


# ---------------------------------------------------------------------- chat template


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """The prompt text of a chat request (see the module docstring).

    ``continue_final_message`` leaves the last message open (no end marker, no generation prompt), as
    vLLM's option of that name does.
    """
    parts = []
    if tools:
        parts.append("<|tools|>\n" + _json(tools) + END)
    parts.extend(render_message(m) for m in messages)
    if continue_final_message and parts:
        parts[-1] = parts[-1].removesuffix(END)
    elif add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return "".join(parts)


def render_message(message: Mapping[str, Any]) -> str:
    head = f"<|{message.get('role')}|>"
    if message.get("name"):
        head += f"[{message['name']}]"
    body = render_content(message.get("content"))
    if message.get("tool_calls"):
        body += "<|tool_calls|>" + _json(message["tool_calls"])
    if message.get("tool_call_id"):
        body += f"<|id:{message['tool_call_id']}|>"
    return head + "\n" + body + END


def render_content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(_render_part(part) for part in content)


def _render_part(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind == "text":
        return str(part.get("text", ""))
    return f"<|{kind}:{xxhash.xxh3_64_hexdigest(_json(part).encode())}|>"


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
