"""Knobs of the shared state, with their defaults (every queue and table here is bounded by one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StateConfig:
    """Redis keys, bounds, intervals and timeouts of :class:`~prefix_router.replication.sync.RedisState`.

    ``stream_maxlen`` bounds the stream (entries; one entry holds up to ``batch_max`` changes) and so
    the backlog a new replica warms up from; ``outbox_capacity`` bounds the changes waiting to be
    published (the oldest are dropped and counted when Redis is down or slow).
    """

    key_prefix: str = "prefix-router"
    stream_maxlen: int = 50_000
    outbox_capacity: int = 50_000
    batch_max: int = 128
    entries_per_flush: int = 64
    read_count: int = 512
    read_block_ms: int = 1000
    load_interval_s: float = 0.5
    load_ttl_s: float = 5.0
    max_replicas: int = 64
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 5.0
    op_timeout_s: float = 2.0
    connect_timeout_s: float = 2.0
    warmup_timeout_s: float = 10.0
    warmup_max_entries: int = 50_000

    def __post_init__(self) -> None:
        for name in ("stream_maxlen", "outbox_capacity", "batch_max", "entries_per_flush", "read_count"):
            if getattr(self, name) <= 0:
                raise ValueError(f"state.{name} must be > 0")
        for name in ("load_interval_s", "load_ttl_s", "op_timeout_s", "connect_timeout_s", "backoff_max_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"state.{name} must be > 0")
        if self.max_replicas <= 0 or self.warmup_max_entries < 0 or self.read_block_ms < 0:
            raise ValueError("state.max_replicas must be > 0 and the read/warm-up bounds >= 0")

    @property
    def stream_key(self) -> str:
        return f"{self.key_prefix}:changes"

    @property
    def replicas_key(self) -> str:
        return f"{self.key_prefix}:replicas"

    def load_key(self, replica_id: str) -> str:
        return f"{self.key_prefix}:load:{replica_id}"
