"""Replication: one prefix view for several router replicas, through Redis Streams
(``serve --replication URL``) or the local channel of ``serve --processes N``. Other packages import only
the names below.
"""

from __future__ import annotations

from prefix_router.replication.connect import attach, default_replica_id, make_client
from prefix_router.replication.local import LocalConfig, LocalReplication
from prefix_router.replication.settings import ReplicationSettings
from prefix_router.replication.sync import RedisReplication
from prefix_router.replication.wiring import ReplicationCollector, install

__all__ = [
    "LocalConfig",
    "LocalReplication",
    "RedisReplication",
    "ReplicationCollector",
    "ReplicationSettings",
    "attach",
    "default_replica_id",
    "install",
    "make_client",
]
