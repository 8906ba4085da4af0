"""Replication: one prefix view for several router replicas, through Redis Streams
(``serve --replication URL``)."""

from prefix_router.replication.connect import attach, default_replica_id
from prefix_router.replication.settings import ReplicationSettings
from prefix_router.replication.sync import RedisReplication

__all__ = ["RedisReplication", "ReplicationSettings", "attach", "default_replica_id"]
