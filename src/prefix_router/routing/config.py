"""Knobs of the routing core, with their defaults. Plain dataclass: the proxy's pydantic config fills it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """Every routing knob. Tokens are estimated as characters / ``chars_per_token`` without a tokenizer."""

    policy: str = "prefix"
    # routing key
    block_chars: int = 64
    chars_per_token: float = 4.0
    block_tokens: int = 16
    max_prefix_chars: int | None = 1_048_576  # examined prefix: 1 MiB of key (about 256 K tokens)
    isolate_tenants: bool = False
    tokenizer_path: str | None = None
    # prefix index bounds
    worker_capacity_tokens: int = 1_000_000
    max_total_blocks: int = 2_000_000
    ttl_s: float = 3600.0
    # policies
    hash_prefix_chars: int = 512
    load_factor: float = 1.25
    load_slack: int = 2
    queue_penalty_tokens: int = 512
    in_flight_penalty_tokens: int = 512
    recompute_weight: float = 1.0  # prefix: future cost of a recomputed token, beyond its own prefill
    saturation_weight: float = 1.0  # prefix: extra weight per request waiting for prefill (fleet mean)
    # prefill cost per token grows with its context: 1 + context / attention_tokens (about 6 x hidden size)
    attention_tokens: int = 32_768
    session_affinity: bool = True
    # engine feedback: a report below this fraction of the prediction means the engine evicted earlier
    feedback_tolerance: float = 0.5
    max_prefix_blocks: int | None = None
    # trackers
    max_tracked_requests: int = 100_000
    max_sessions: int = 100_000
    engine_load_stale_s: float = 10.0
