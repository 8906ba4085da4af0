"""The ``discovery:`` config section as a running source that feeds a ``WorkerPool`` (``serve`` starts it
on start-up and stops it on cleanup, see ``prefix_router.node.life.build``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.settings import DiscoverySettings
from prefix_router.pool.worker_discovery.dns import DnsDiscovery
from prefix_router.pool.worker_discovery.membership import Membership
from prefix_router.pool.worker_discovery.pool_sink import AddedHook, PoolSink
from prefix_router.settings import ConfigError

log = logging.getLogger(__name__)
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
POLL_S = 0.02


class Source(Protocol):
    failures: int

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class WorkerDiscovery:
    """The source ``settings.kind`` names, reporting to ``Membership(PoolSink(pool, settings.worker,
    on_added), max_workers)``. ``api`` replaces the Kubernetes API client (tests)."""

    def __init__(
        self,
        settings: DiscoverySettings,
        pool: WorkerPool,
        max_workers: int,
        on_added: AddedHook | None = None,
        *,
        api: Any = None,
    ) -> None:
        self.settings = settings
        self.sink = PoolSink(pool, settings.worker.model_dump(), on_added)
        self.membership = Membership(self.sink, max_workers)
        self._owned_api = api is None and settings.kind in ("kubernetes", "inferencepool")
        self.source = build_source(settings, self.membership, api)
        # the role labels: an InferencePool's pods', a Service's EndpointSlices'
        role_of = getattr(getattr(self.source, "table", None), "role_of", None)
        if role_of is not None:
            self.sink.role_of = role_of

    async def start(self) -> bool:
        """Start the source and wait up to ``startup_wait_s`` for its first answer (True if it came)."""
        before = self.membership.updates
        self.source.start()
        answered = await wait_until(lambda: self.membership.updates > before, self.settings.startup_wait_s)
        what = f"{self.settings.kind} discovery of {self.settings.service}"
        if answered:
            log.info("%s: %d workers", what, len(self.membership.urls))
        else:
            log.warning("%s: no answer within %.1fs; starting without", what, self.settings.startup_wait_s)
        return answered

    async def stop(self) -> None:
        await self.source.stop()
        await self.sink.close()
        if self._owned_api:
            self.source.api.api_client.close()  # type: ignore[attr-defined]

    def stats(self) -> dict[str, int]:
        return {
            "workers": len(self.membership.urls),
            "over_limit": self.membership.over_limit,
            "updates": self.membership.updates,
            "failures": self.source.failures,
            "rejected": self.sink.rejected,
        }


def build_source(settings: DiscoverySettings, membership: Membership, api: Any = None) -> Source:
    if settings.service is None or settings.kind is None:
        raise ConfigError("invalid config: discovery: kind and service are required")
    if settings.kind == "dns":
        if settings.port is None:
            raise ConfigError("invalid config: discovery: port: required with kind dns")
        return DnsDiscovery(
            settings.service,
            settings.port,
            membership,
            interval_s=settings.interval_s,
            scheme=settings.scheme,
            timeout_s=settings.timeout_s,
        )
    if settings.kind == "inferencepool":
        return inference_pool_source(settings, settings.service, membership, api)
    return kubernetes_source(settings, settings.service, membership, api)


def inference_pool_source(settings: DiscoverySettings, pool: str, membership: Membership, api: Any) -> Source:
    """``api``: a ``(CoreV1Api, CustomObjectsApi)`` pair (tests), else from the credentials."""
    try:
        from prefix_router.pool.worker_discovery.kubernetes import InferencePoolDiscovery
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("kubernetes"):
            raise
        raise ConfigError(K8S_MISSING.replace("kubernetes needs", "inferencepool needs")) from None

    core, custom = api if api is not None else inference_pool_apis(settings.in_cluster)
    return InferencePoolDiscovery(
        core,
        custom,
        settings.namespace or pod_namespace(),
        pool,
        membership,
        scheme=settings.scheme,
        watch_timeout_s=settings.watch_timeout_s,
        max_pods=settings.max_pods,
    )


def inference_pool_apis(in_cluster: bool | None) -> tuple[Any, Any]:
    from kubernetes.client import CoreV1Api, CustomObjectsApi

    kubernetes_api(in_cluster)  # loads the credentials (one-line ConfigError without any)
    return CoreV1Api(), CustomObjectsApi()


K8S_MISSING = (
    "invalid config: discovery.kind: kubernetes needs the Kubernetes client, which is not installed"
    " (pip install 'prefix-router[k8s]')"
)


def kubernetes_source(settings: DiscoverySettings, service: str, membership: Membership, api: Any) -> Source:
    try:
        from prefix_router.pool.worker_discovery.kubernetes import EndpointSliceDiscovery
    except ModuleNotFoundError as exc:  # the optional extra "k8s" is missing: one line, no traceback
        if not (exc.name or "").startswith("kubernetes"):
            raise
        raise ConfigError(K8S_MISSING) from None

    return EndpointSliceDiscovery(
        api if api is not None else kubernetes_api(settings.in_cluster),
        settings.namespace or pod_namespace(),
        service,
        membership,
        port_name=settings.port_name,
        scheme=settings.scheme,
        watch_timeout_s=settings.watch_timeout_s,
        max_slices=settings.max_slices,
    )


def kubernetes_api(in_cluster: bool | None) -> Any:
    """``make_api``, with missing credentials as a one-line ``ConfigError``."""
    from kubernetes.config import ConfigException

    from prefix_router.pool.worker_discovery.kubernetes import make_api

    try:
        return make_api(in_cluster)
    except (ConfigException, OSError) as exc:
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"invalid config: discovery.kind: kubernetes: no API credentials ({why})") from None


def pod_namespace(path: Path = NAMESPACE_FILE) -> str:
    """The namespace of the pod's service account, else ``default``."""
    try:
        return path.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


async def wait_until(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


class DiscoveryCollector(Collector):
    """``prefix_router_discovery_{workers,over_limit}`` gauges, ``..._{updates,failures,rejected}_total``."""

    GAUGES = frozenset({"workers", "over_limit"})

    def __init__(self, discovery: WorkerDiscovery) -> None:
        self.discovery = discovery

    def collect(self) -> Iterator[Metric]:
        for name, value in self.discovery.stats().items():
            family = GaugeMetricFamily if name in self.GAUGES else CounterMetricFamily
            yield family(f"prefix_router_discovery_{name}", f"worker discovery: {name}", value=value)
