"""Mooncake trace replay (``mooncake_conversation_trace.jsonl``, in ``../shared/traces``, never copied).

Each row is one single-turn request. Its ``hash_ids`` are mapped deterministically to blocks of text
(``text(seed, id)``), concatenated in order, so equal ids give equal text prefixes; the last block is cut
to the row's ``input_length``. Arrivals are the row timestamps (ms), spread uniformly over their ~3 s
bucket.

CPU-scale knob: the trace's blocks are 512 tokens. ``block_tokens`` sets the tokens generated per hash id
(e.g. 16 for a CPU run: prompts ~32x shorter); input and output lengths are scaled by
``block_tokens / 512`` (and ``output_scale`` multiplies output lengths further).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterator
from itertools import islice
from typing import Any

import orjson

from prefix_router.lab.workloads.arrivals import spread_buckets
from prefix_router.lab.workloads.settings import WorkloadSettings
from prefix_router.lab.workloads.text import random_text, rng_for
from prefix_router.lab.workloads.traces import MOONCAKE_FILE, find_trace
from prefix_router.lab.workloads.types import Session, Turn
from prefix_router.protocol import MOONCAKE_BLOCK_TOKENS, Endpoint


class MooncakeSettings(WorkloadSettings):
    trace: str | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS  # tokens of text per hash id (scale down for CPU runs)
    output_scale: float = 1.0  # extra factor on output lengths (after the block scaling)
    max_output_tokens: int = 4096
    start_row: int = 0
    bucket_s: float = 3.0  # timestamps are bucketed: spread requests over the bucket
    endpoint: str = "completions"  # or "chat" (the prompt as one user message)
    cache_blocks: int = 65_536  # capacity of the block-text cache


class BlockTexts:
    """Text per hash id, memoised in an LRU of bounded ``capacity`` (ids repeat: block 0 everywhere)."""

    def __init__(self, seed: int, block_tokens: int, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.seed = seed
        self.block_tokens = block_tokens
        self.capacity = capacity
        self._cache: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._cache)

    def get(self, hash_id: int) -> str:
        text = self._cache.get(hash_id)
        if text is None:
            text = random_text(rng_for("mooncake", self.seed, hash_id), self.block_tokens)
            self._cache[hash_id] = text
            if len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(hash_id)
        return text


def prompt_for(row: dict[str, Any], texts: BlockTexts) -> str:
    """Concatenated block texts of ``hash_ids``, cut to the scaled input length."""
    scale = texts.block_tokens / MOONCAKE_BLOCK_TOKENS
    n_chars = max(1, round(int(row["input_length"]) * scale)) * 4
    return "".join(texts.get(int(h)) for h in row["hash_ids"])[:n_chars]


def rows(opts: MooncakeSettings, count: int) -> Iterator[dict[str, Any]]:
    with find_trace(MOONCAKE_FILE, opts.trace).open("rb") as handle:
        for line in islice(handle, opts.start_row, opts.start_row + count):
            yield orjson.loads(line)


def build(opts: MooncakeSettings, requests: int, seed: int) -> list[Session]:
    if opts.endpoint not in ("chat", "completions"):
        raise ValueError("endpoint must be chat or completions")
    texts = BlockTexts(seed, opts.block_tokens, opts.cache_blocks)
    loaded = list(rows(opts, requests))
    times = spread_buckets(
        [r["timestamp"] / 1000.0 for r in loaded], opts.bucket_s, random.Random(f"mc:{seed}")
    )
    start = min(times, default=0.0)
    return [
        _session(i, r, t - start, texts, opts) for i, (r, t) in enumerate(zip(loaded, times, strict=True))
    ]


def _session(
    index: int, row: dict[str, Any], arrival: float, texts: BlockTexts, opts: MooncakeSettings
) -> Session:
    scale = opts.block_tokens / MOONCAKE_BLOCK_TOKENS * opts.output_scale
    out = min(opts.max_output_tokens, max(1, round(int(row["output_length"]) * scale)))
    prompt = prompt_for(row, texts)
    endpoint: Endpoint = "chat" if opts.endpoint == "chat" else "completions"
    turn = Turn(max_tokens=out, prompt=prompt) if endpoint == "completions" else _chat_turn(prompt, out)
    return Session(
        session_id=f"mooncake-{opts.start_row + index}", arrival_s=arrival, turns=(turn,), endpoint=endpoint
    )


def _chat_turn(prompt: str, out: int) -> Turn:
    return Turn(max_tokens=out, messages=({"role": "user", "content": prompt},))
