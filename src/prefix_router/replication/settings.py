"""Settings of the replication: the ``replication:`` section (``serve --replication URL``), frozen and
typed, every queue and table here bounded by one of them. Off without ``url``."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator, model_validator

from prefix_router.settings import Section


class ReplicationSettings(Section):
    """The Redis to share the prefix view through, its keys, bounds, intervals and timeouts.

    ``stream_maxlen`` bounds the stream (entries; one entry holds up to ``batch_max`` changes) and so
    the backlog a new replica warms up from; ``outbox_capacity`` bounds the changes waiting to be
    published (the oldest are dropped and counted when Redis is down or slow). A received entry over
    ``max_entry_bytes`` or ``batch_max`` changes is refused and counted, never applied (``admit``): every
    replica must share these two.
    """

    url: str | None = None  # redis://HOST:PORT/DB (rediss://, unix:// too); None: this replica alone
    password: SecretStr | None = None  # Redis AUTH (PREFIX_ROUTER_REPLICATION__PASSWORD, from a Secret)
    replica_id: str | None = Field(default=None, max_length=253)  # default: HOSTNAME (the pod name)
    key_prefix: str = Field(default="prefix-router", min_length=1, max_length=128)
    stream_maxlen: int = Field(default=50_000, gt=0)
    outbox_capacity: int = Field(default=50_000, gt=0)
    batch_max: int = Field(default=128, gt=0)  # changes per stream entry (an entry with more is refused)
    max_entry_bytes: int = Field(default=1 << 20, ge=4096)  # one entry's payload (bigger: refused)
    entries_per_flush: int = Field(default=64, gt=0)
    read_count: int = Field(default=512, gt=0)  # entries per XREAD
    read_block_ms: int = Field(default=1000, ge=0)
    load_interval_s: float = Field(default=0.5, gt=0)  # in-flight counts published this often
    load_ttl_s: float = Field(default=5.0, gt=0)  # other replicas' counts forgotten after this
    max_replicas: int = Field(default=64, gt=0)
    backoff_initial_s: float = Field(default=0.05, gt=0)
    backoff_max_s: float = Field(default=5.0, gt=0)
    op_timeout_s: float = Field(default=2.0, gt=0)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    warmup_timeout_s: float = Field(default=10.0, gt=0)  # start-up waits this long for the backlog

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("expected redis://HOST:PORT/DB")
        return value

    @field_validator("password", mode="before")
    @classmethod
    def _check_password(cls, value: object) -> object:
        """A password read from a secret file loses its surrounding whitespace; an empty one is none."""
        if isinstance(value, int | float | str):
            value = str(value).strip() or None
        return value

    @model_validator(mode="after")
    def _check_backoff(self) -> ReplicationSettings:
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError("backoff_initial_s: must be <= backoff_max_s")
        return self

    @property
    def stream_key(self) -> str:
        return f"{self.key_prefix}:changes"

    @property
    def replicas_key(self) -> str:
        return f"{self.key_prefix}:replicas"

    def load_key(self, replica_id: str) -> str:
        return f"{self.key_prefix}:load:{replica_id}"
