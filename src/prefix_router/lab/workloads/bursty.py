"""Bursty multi-tenant mix: tenants with their own system prompts whose traffic comes in bursts.

Each of ``tenants`` tenants has a fixed system prompt (``system_tokens`` to ``system_tokens_max`` tokens,
uniform) and a base popularity (Zipf ``zipf_s``). A session is either one question or, with probability
``conversation_share``, a conversation of ``turns_min`` to ``turns_max`` turns under the tenant's prompt
(each turn sent with the whole history including the generated replies, after an exponential think time
of mean ``think_time_s``). Questions are ``question_tokens`` to ``question_tokens_max`` tokens, replies
``output_tokens`` to ``output_tokens_max``.

Arrivals: each tenant alternates between calm spells (exponential, mean ``calm_s``) and bursts (mean
``burst_s``) during which its session rate is ``burst_factor`` times its base rate; sessions arrive as a
Poisson process at the current rate; ``rate`` is the fleet's base session rate (sessions/s, before bursts).
So at any moment one or two tenants are hot, and which ones changes: a router must spread a hot
prefix over several workers while it is hot and keep every tenant's prefix somewhere cached.
"""

from __future__ import annotations

import random

from prefix_router.lab.workloads.chatbots import zipf_weights
from prefix_router.lab.workloads.settings import WorkloadSettings
from prefix_router.lab.workloads.text import random_text, rng_for, tagged_text
from prefix_router.lab.workloads.types import Session, Turn


class BurstySettings(WorkloadSettings):
    tenants: int = 12
    system_tokens: int = 1024
    system_tokens_max: int = 8192
    zipf_s: float = 0.8
    conversation_share: float = 0.5
    turns_min: int = 2
    turns_max: int = 6
    think_time_s: float = 5.0
    question_tokens: int = 64
    question_tokens_max: int = 512
    output_tokens: int = 32
    output_tokens_max: int = 256
    rate: float = 2.0
    burst_factor: float = 8.0
    burst_s: float = 10.0
    calm_s: float = 60.0


def build(opts: BurstySettings, requests: int, seed: int) -> list[Session]:
    _check(opts)
    prompts = _system_prompts(opts, seed)
    rng = random.Random(f"bursty:{seed}")
    weights = zipf_weights(opts.tenants, opts.zipf_s)
    total = sum(weights)
    horizon = _horizon(opts, requests)
    starts = sorted(
        (t, tenant)
        for tenant in range(opts.tenants)
        for t in _arrivals(opts.rate * weights[tenant] / total, horizon, opts, rng)
    )
    sessions: list[Session] = []
    left = requests
    for index, (start, tenant) in enumerate(starts):
        if left <= 0:
            break
        session = _session(index, tenant, start, prompts[tenant], opts, rng, left)
        sessions.append(session)
        left -= len(session.turns)
    return sessions


def _check(opts: BurstySettings) -> None:
    if opts.tenants < 1 or opts.turns_min < 1 or opts.turns_max < opts.turns_min:
        raise ValueError("tenants >= 1 and 1 <= turns_min <= turns_max required")
    if opts.rate <= 0 or opts.burst_factor < 1 or opts.burst_s <= 0 or opts.calm_s <= 0:
        raise ValueError("rate, burst_s and calm_s must be > 0 and burst_factor >= 1")
    if not 0.0 <= opts.conversation_share <= 1.0:
        raise ValueError("conversation_share must be in [0, 1]")


def _system_prompts(opts: BurstySettings, seed: int) -> list[str]:
    lengths = random.Random(f"bursty-lengths:{seed}")
    low, high = sorted((opts.system_tokens, opts.system_tokens_max))
    return [
        tagged_text(f"tenant {t} system", rng_for("bursty", seed, t), lengths.randint(low, high))
        for t in range(opts.tenants)
    ]


def _horizon(opts: BurstySettings, requests: int) -> float:
    """Long enough, in expectation with margin, for ``requests`` turns."""
    hot = opts.burst_s / (opts.burst_s + opts.calm_s)
    sessions_per_s = opts.rate * (1.0 + (opts.burst_factor - 1.0) * hot)
    turns = 1.0 + opts.conversation_share * ((opts.turns_min + opts.turns_max) / 2.0 - 1.0)
    return 2.0 * requests / (sessions_per_s * turns) + opts.burst_s + opts.calm_s


def _arrivals(rate: float, horizon: float, opts: BurstySettings, rng: random.Random) -> list[float]:
    """Session starts of one tenant: Poisson at ``rate``, times ``burst_factor`` during its bursts."""
    times: list[float] = []
    now, bursting = 0.0, False
    spell_end = rng.uniform(0.0, opts.calm_s)  # a random phase: the first calm spell is cut short
    while now < horizon:
        current = rate * (opts.burst_factor if bursting else 1.0)
        step = rng.expovariate(current)
        if now + step >= spell_end:
            now, bursting = spell_end, not bursting
            spell_end = now + rng.expovariate(1.0 / (opts.burst_s if bursting else opts.calm_s))
            continue
        now += step
        times.append(now)
    return times


def _session(
    index: int,
    tenant: int,
    start: float,
    system: str,
    opts: BurstySettings,
    rng: random.Random,
    left: int,
) -> Session:
    conversation = rng.random() < opts.conversation_share
    count = rng.randint(opts.turns_min, opts.turns_max) if conversation else 1
    turns = tuple(_turn(index, k, opts, rng) for k in range(min(count, left)))
    return Session(
        session_id=f"bursty-{index}",
        arrival_s=start,
        turns=turns,
        preamble=({"role": "system", "content": system},),
        tenant=f"tenant-{tenant}",
    )


def _turn(index: int, k: int, opts: BurstySettings, rng: random.Random) -> Turn:
    tokens = rng.randint(opts.question_tokens, max(opts.question_tokens, opts.question_tokens_max))
    question = f"Question {index}.{k}: {random_text(rng, tokens)}?"
    out = rng.randint(opts.output_tokens, max(opts.output_tokens, opts.output_tokens_max))
    think = rng.expovariate(1.0 / opts.think_time_s) if k and opts.think_time_s > 0 else 0.0
    return Turn(max_tokens=out, messages=({"role": "user", "content": question},), think_time_s=think)
