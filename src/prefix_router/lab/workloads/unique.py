"""Unique prompts: no two requests share anything (the negative control).

Each prompt starts with a distinct tag, so not even its first characters are shared, and has no system
prompt. Prefix-aware routing cannot gain here and must not lose beyond noise.
"""

from __future__ import annotations

from prefix_router.lab.workloads.settings import WorkloadSettings
from prefix_router.lab.workloads.text import rng_for, tagged_text
from prefix_router.lab.workloads.types import Session, Turn


class UniqueSettings(WorkloadSettings):
    prompt_tokens: int = 1024
    output_tokens: int = 32


def build(opts: UniqueSettings, requests: int, seed: int) -> list[Session]:
    return [_session(i, opts, seed) for i in range(requests)]


def _session(index: int, opts: UniqueSettings, seed: int) -> Session:
    text = tagged_text(f"unique {seed}-{index}", rng_for("unique", seed, index), opts.prompt_tokens)
    turn = Turn(max_tokens=opts.output_tokens, messages=({"role": "user", "content": text},))
    return Session(session_id=f"unique-{index}", arrival_s=0.0, turns=(turn,))
