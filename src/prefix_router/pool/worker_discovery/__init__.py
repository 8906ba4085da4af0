"""Worker discovery: workers join and leave the pool as Kubernetes pods or DNS records come and go.

Sources (``kubernetes``: EndpointSlices of a Service; ``dns``: a headless Service name resolved on an
interval) report full snapshots of worker URLs to a :class:`Membership`, which turns them into
``on_add(url)`` / ``on_remove(url)`` calls on a listener (``PoolSink`` feeds a ``WorkerPool``).
(``prefix_router.pool.identify`` is another thing: model and engine detection per worker.)
"""

from prefix_router.pool.worker_discovery.membership import DiscoveryListener, Membership

__all__ = ["DiscoveryListener", "Membership"]
