"""Mixed: chatbot requests interleaved with ShareGPT multi-turn conversations (the demo's workload).

One service with ``tenants`` chatbots: some users ask one short question, others hold a multi-turn
conversation (replayed from ShareGPT). With ``conversations_use_tenants`` (default) a conversation runs
under a tenant's system prompt (same Zipf popularity) instead of ``system_prompt``, as in a real chat
product; the conversation's history then extends that tenant's shared prefix.
"""

from __future__ import annotations

import dataclasses
import random

from prefix_router.lab.workloads import chatbots, multiturn
from prefix_router.lab.workloads.settings import WorkloadSettings
from prefix_router.lab.workloads.types import Session


class MixedSettings(WorkloadSettings):
    chat_share: float = 0.5  # fraction of requests from the chatbot shape, the rest multi-turn turns
    tenants: int = 16
    system_tokens: int = 1024
    system_tokens_max: int | None = None
    zipf_s: float = 1.1
    question_tokens: int = 24
    output_tokens: int = 32
    trace: str | None = None
    max_turns: int = 6
    max_user_tokens: int = 256
    max_output_tokens: int = 48
    think_time_s: float = 0.0
    system_prompt: str = "You are a helpful assistant."
    conversations_use_tenants: bool = True
    synthetic_fallback: bool = True  # without the ShareGPT trace, synthetic conversations (ids synthetic-N)


def build(opts: MixedSettings, requests: int, seed: int) -> list[Session]:
    if not 0.0 <= opts.chat_share <= 1.0:
        raise ValueError("chat_share must be in [0, 1]")
    n_chat = round(requests * opts.chat_share)
    conversations = _multiturn(opts, requests - n_chat, seed)
    if opts.conversations_use_tenants:
        conversations = _under_tenants(conversations, opts, seed)
    sessions = chatbots.build(_chat_options(opts), n_chat, seed) + conversations
    random.Random(f"mixed:{seed}").shuffle(sessions)
    return sessions


def _under_tenants(sessions: list[Session], opts: MixedSettings, seed: int) -> list[Session]:
    """Each conversation gets a tenant (Zipf) and that tenant's system prompt."""
    chat = _chat_options(opts)
    prompts = chatbots.system_prompts(chat, seed)
    rng = random.Random(f"mixed-tenants:{seed}")
    picks = rng.choices(
        range(chat.tenants), weights=chatbots.zipf_weights(chat.tenants, chat.zipf_s), k=len(sessions)
    )
    return [
        dataclasses.replace(s, preamble=({"role": "system", "content": prompts[t]},), tenant=f"tenant-{t}")
        for s, t in zip(sessions, picks, strict=True)
    ]


def _chat_options(opts: MixedSettings) -> chatbots.ChatbotSettings:
    return chatbots.ChatbotSettings(
        tenants=opts.tenants,
        system_tokens=opts.system_tokens,
        system_tokens_max=opts.system_tokens_max,
        zipf_s=opts.zipf_s,
        question_tokens=opts.question_tokens,
        output_tokens=opts.output_tokens,
    )


def _multiturn(opts: MixedSettings, requests: int, seed: int) -> list[Session]:
    if requests <= 0:
        return []
    mt = multiturn.MultiTurnSettings(
        trace=opts.trace,
        max_turns=opts.max_turns,
        max_user_tokens=opts.max_user_tokens,
        max_output_tokens=opts.max_output_tokens,
        think_time_s=opts.think_time_s,
        system_prompt=opts.system_prompt,
        synthetic_fallback=opts.synthetic_fallback,
    )
    return multiturn.build(mt, requests, seed)
