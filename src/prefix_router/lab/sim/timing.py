"""The step-time model: how long one forward pass of a continuous batch takes.

One step processes every decoding sequence (one token each) plus chunks of prompts being prefilled, as
vLLM's chunked-prefill scheduler does. Its time (roofline style, see ``profiles.py``):

    overhead + max(weights_read, tokens x token_compute)        # memory-bound floor vs GEMM compute
             + attention_pair x sum over new prompt tokens of their context length   # quadratic term
             + kv_read x total decode context                   # decode attention reads the KV cache
             + per_seq x sequences in the batch

so prefill time grows linearly in uncached tokens plus attention's quadratic term, and decode step time
grows with batch size and context. A pure-decode stretch has step times that grow linearly (every step
adds one token per sequence), so k steps have a closed form (``decode_span_time``).
"""

from __future__ import annotations

import math

from prefix_router.lab.sim.profiles import EngineProfile


def prefill_pairs(start: int, tokens: int) -> int:
    """Attention (query, key) pairs of ``tokens`` new tokens following ``start`` cached/computed ones."""
    return tokens * start + tokens * (tokens + 1) // 2


def step_time(
    p: EngineProfile, prefill_tokens: int, pairs: int, prefill_seqs: int, decode_seqs: int, decode_ctx: int
) -> float:
    """Duration of one mixed step."""
    tokens = prefill_tokens + decode_seqs
    return (
        p.step_overhead_s
        + max(p.weights_read_s, tokens * p.token_compute_s)
        + p.attention_pair_s * pairs
        + p.kv_read_s_per_token * decode_ctx
        + p.per_seq_s * (prefill_seqs + decode_seqs)
    )


def decode_coefficients(p: EngineProfile, seqs: int, ctx: int) -> tuple[float, float]:
    """(first step time, growth per step) of a pure-decode stretch with ``seqs`` sequences."""
    first = step_time(p, 0, 0, 0, seqs, ctx)
    return first, p.kv_read_s_per_token * seqs


def decode_span_time(first: float, growth: float, steps: int) -> float:
    """Total time of ``steps`` decode steps whose durations are first, first+growth, ..."""
    return steps * first + growth * steps * (steps - 1) / 2.0


def steps_reaching(first: float, growth: float, elapsed: float) -> int:
    """The smallest k >= 1 with decode_span_time(k) >= elapsed (the step boundary at or after it)."""
    if elapsed <= first:
        return 1
    # root of (growth/2) k^2 + (first - growth/2) k - elapsed = 0, in the form stable for tiny growth
    a, b = growth / 2.0, first - growth / 2.0
    k = max(1, math.ceil(2.0 * elapsed / (b + math.sqrt(b * b + 4.0 * a * elapsed))))
    while k > 1 and decode_span_time(first, growth, k - 1) >= elapsed:
        k -= 1
    while decode_span_time(first, growth, k) < elapsed:
        k += 1
    return k


def steps_within(first: float, growth: float, budget: float) -> int:
    """The largest k >= 1 with decode_span_time(k) <= budget (at least one step)."""
    k = steps_reaching(first, growth, budget)
    if k > 1 and decode_span_time(first, growth, k) > budget:
        k -= 1
    return k
