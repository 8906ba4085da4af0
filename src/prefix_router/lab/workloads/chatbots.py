"""Chatbots: N tenants, each with a fixed system prompt, picked with Zipf popularity; short user questions.

Requests of one tenant share the tenant's whole system prompt; requests of different tenants share nothing.
"""

from __future__ import annotations

import random

from prefix_router.lab.workloads.settings import WorkloadSettings
from prefix_router.lab.workloads.text import random_text, rng_for, tagged_text
from prefix_router.lab.workloads.types import Session, Turn


class ChatbotSettings(WorkloadSettings):
    tenants: int = 16
    system_tokens: int = 1024
    system_tokens_max: int | None = None  # lengths uniform in [system_tokens, system_tokens_max]
    zipf_s: float = 1.1  # popularity of tenant i is proportional to 1 / (i + 1) ** zipf_s
    question_tokens: int = 24
    output_tokens: int = 32


def zipf_weights(n: int, s: float) -> list[float]:
    """Unnormalised Zipf weights for ranks 1..n (s = 0 gives uniform)."""
    return [1.0 / (rank**s) for rank in range(1, n + 1)]


def system_prompts(opts: ChatbotSettings, seed: int) -> list[str]:
    """One fixed system prompt per tenant."""
    high = opts.system_tokens_max or opts.system_tokens
    lengths = random.Random(f"chatbot-lengths:{seed}")
    prompts = []
    for tenant in range(opts.tenants):
        tokens = lengths.randint(min(opts.system_tokens, high), max(opts.system_tokens, high))
        prompts.append(tagged_text(f"tenant {tenant} system", rng_for("chatbot", seed, tenant), tokens))
    return prompts


def build(opts: ChatbotSettings, requests: int, seed: int) -> list[Session]:
    if opts.tenants < 1:
        raise ValueError("tenants must be >= 1")
    prompts = system_prompts(opts, seed)
    rng = random.Random(f"chatbot-requests:{seed}")
    picks = rng.choices(range(opts.tenants), weights=zipf_weights(opts.tenants, opts.zipf_s), k=requests)
    return [_session(i, tenant, prompts[tenant], opts, rng) for i, tenant in enumerate(picks)]


def _session(index: int, tenant: int, system: str, opts: ChatbotSettings, rng: random.Random) -> Session:
    question = f"Question {index}: {random_text(rng, opts.question_tokens)}?"
    turn = Turn(max_tokens=opts.output_tokens, messages=({"role": "user", "content": question},))
    return Session(
        session_id=f"chatbot-{index}",
        arrival_s=0.0,
        turns=(turn,),
        preamble=({"role": "system", "content": system},),
        tenant=f"tenant-{tenant}",
    )
