"""Shared prefix state for several router replicas, through Redis Streams (``serve --state URL``)."""

from prefix_router.replication.config import StateConfig
from prefix_router.replication.connect import attach, default_replica_id
from prefix_router.replication.sync import RedisState

__all__ = ["RedisState", "StateConfig", "attach", "default_replica_id"]
