"""Plain counters of the shared state (the proxy maps them to Prometheus metrics)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(slots=True)
class ReplicationStats:
    published_changes: int = 0  # index changes taken from the outbox
    sent_changes: int = 0  # what went out once runs of inserts were merged (``coalesce``)
    published_entries: int = 0
    publish_failures: int = 0
    encode_errors: int = 0
    received_entries: int = 0
    applied_changes: int = 0
    own_entries: int = 0
    unknown_worker_changes: int = 0
    decode_errors: int = 0
    refused_entries: int = 0  # over a bound or implausible (``admit``): none of their changes applied
    stream_resets: int = 0  # the stream found behind this replica's cursor or ahead of Redis's clock
    read_failures: int = 0
    load_failures: int = 0
    reconnects: int = 0
    gaps: int = 0
    warmup_changes: int = 0
    warmup_seconds: float = 0.0
    remote_replicas: int = 0

    @property
    def failures(self) -> int:
        return self.publish_failures + self.read_failures + self.load_failures

    def as_dict(self, outbox_size: int = 0, outbox_dropped: int = 0) -> dict[str, float]:
        """Every counter, ``failures`` and the outbox's size and drops (what every replication reports)."""
        out = {f.name: float(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["failures"] = float(self.failures)
        out["outbox_size"] = float(outbox_size)
        out["outbox_dropped"] = float(outbox_dropped)
        return out
