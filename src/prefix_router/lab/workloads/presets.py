"""Presets compatible with published benchmark datasets, so results compare with published ones.

- ``sglang-gsp``: SGLang ``bench_serving --dataset-name generated-shared-prefix`` defaults: 64 groups x 16
  prompts, a 2,048-token system prompt per group, a 128-token question, 256 output tokens; the prompt is
  ``system + "\\n\\n" + question`` (completions), requests shuffled.
- ``vllm-prefix-repetition``: vLLM ``bench serve --dataset-name prefix_repetition`` defaults: 10 prefixes of
  256 tokens, 256-token suffixes, 128 output tokens; requests spread evenly over the prefixes, shuffled.

Lengths are in estimated tokens (about 4 characters each), not a model tokenizer's tokens.
"""

from __future__ import annotations

import random

from prefix_router.lab.workloads.settings import WorkloadSettings
from prefix_router.lab.workloads.text import random_text, rng_for, tagged_text
from prefix_router.lab.workloads.types import Session, Turn


class GspSettings(WorkloadSettings):
    groups: int = 64
    prompts_per_group: int = 16
    system_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 256


class PrefixRepetitionSettings(WorkloadSettings):
    prefixes: int = 10
    prefix_tokens: int = 256
    suffix_tokens: int = 256
    output_tokens: int = 128


def _single(session_id: str, prompt: str, output_tokens: int) -> Session:
    turn = Turn(max_tokens=output_tokens, prompt=prompt)
    return Session(session_id=session_id, arrival_s=0.0, turns=(turn,), endpoint="completions")


def build_gsp(opts: GspSettings, requests: int, seed: int) -> list[Session]:
    """``requests`` defaults to groups x prompts_per_group; fewer keeps the first ones of the shuffle."""
    rng = random.Random(f"gsp:{seed}")
    systems = [
        tagged_text(f"group {g}", rng_for("gsp", seed, g), opts.system_tokens) for g in range(opts.groups)
    ]
    pairs = [(g, p) for g in range(opts.groups) for p in range(opts.prompts_per_group)]
    rng.shuffle(pairs)
    return [_gsp_session(i, g, systems[g], opts, rng) for i, (g, _) in enumerate(_cycle(pairs, requests))]


def _gsp_session(index: int, group: int, system: str, opts: GspSettings, rng: random.Random) -> Session:
    question = random_text(rng, opts.question_tokens)
    return _single(f"gsp-{index}-g{group}", f"{system}\n\n{question}", opts.output_tokens)


def build_prefix_repetition(opts: PrefixRepetitionSettings, requests: int, seed: int) -> list[Session]:
    rng = random.Random(f"prefix-repetition:{seed}")
    prefixes = [
        tagged_text(f"prefix {p}", rng_for("pr", seed, p), opts.prefix_tokens) for p in range(opts.prefixes)
    ]
    picks = [i % opts.prefixes for i in range(requests)]
    rng.shuffle(picks)
    return [
        _single(f"prefix-rep-{i}", prefixes[p] + random_text(rng, opts.suffix_tokens), opts.output_tokens)
        for i, p in enumerate(picks)
    ]


def _cycle(pairs: list[tuple[int, int]], requests: int) -> list[tuple[int, int]]:
    """``requests`` items of ``pairs``, repeated in order when more are asked for than exist."""
    return [pairs[i % len(pairs)] for i in range(requests)] if pairs else []
