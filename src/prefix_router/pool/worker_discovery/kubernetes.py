"""Kubernetes discovery: list, then watch, the EndpointSlices of a named Service with the official
``kubernetes`` client; every serving endpoint is a worker. ``InferencePoolDiscovery``: the same loop over
the ready Pods an ``InferencePool`` selects (Gateway API Inference Extension), each on its target ports.

The client is synchronous, so the list/watch loop runs in a daemon thread and hands each new snapshot of
URLs to the event loop (``Membership.replace`` runs on the loop). A watch that ends (server timeout) is
resumed from the last resourceVersion; "410 Gone" (too old) relists; other errors back off exponentially
and relist. Errors never empty the pool: the last known workers stay until the API says otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from kubernetes.client import CoreV1Api, CustomObjectsApi, DiscoveryV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from prefix_router.pool.worker_discovery.inference_pool import (
    GROUP,
    PLURAL,
    VERSION,
    PodTable,
    PoolTarget,
    pool_target,
)
from prefix_router.pool.worker_discovery.membership import Membership
from prefix_router.pool.worker_discovery.slices import SliceTable

log = logging.getLogger(__name__)
SERVICE_LABEL = "kubernetes.io/service-name"
GONE = 410


class _Gone(Exception):
    """The watch's resourceVersion is too old (or what it selects changed): list again."""


class Table(Protocol):
    def reset(self, items: Iterable[Mapping[str, Any]]) -> None: ...

    def apply(self, kind: str, obj: Mapping[str, Any]) -> bool: ...

    def urls(self) -> set[str]: ...


def make_api(in_cluster: bool | None = None) -> DiscoveryV1Api:
    """A DiscoveryV1Api from the pod's service account (in a cluster) or else ``~/.kube/config``."""
    load_credentials(in_cluster)
    return DiscoveryV1Api()


def load_credentials(in_cluster: bool | None) -> None:
    """The client's default configuration from the service account, else ``~/.kube/config``."""
    from kubernetes import config

    if in_cluster is not False:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return
        except config.ConfigException:
            if in_cluster:
                raise
    config.load_kube_config()  # type: ignore[no-untyped-call]


class EndpointSliceDiscovery:
    """Keeps ``membership`` equal to the serving endpoints of ``service`` in ``namespace``."""

    def __init__(
        self,
        api: DiscoveryV1Api,
        namespace: str,
        service: str,
        membership: Membership,
        *,
        port_name: str | None = None,
        scheme: str = "http",
        watch_timeout_s: int = 60,
        max_slices: int = 64,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.api, self.namespace, self.service = api, namespace, service
        self.membership = membership
        self.table: Table = SliceTable(max_slices, port_name, scheme)
        self.watch_timeout_s = watch_timeout_s
        self.backoff = (backoff_initial_s, backoff_max_s)
        self.failures = self.lists = self.events = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resp: Any = None

    # ------------------------------------------------------------ lifecycle (event loop side)

    def start(self) -> None:
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"k8s-discovery-{self.service}", daemon=True
            )
            self._thread.start()

    async def stop(self, timeout_s: float = 2.0) -> None:
        thread, self._thread = self._thread, None
        self._stop.set()
        _abort(self._resp)
        if thread is not None:
            await asyncio.to_thread(thread.join, timeout_s)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self.list_once()
                while not self._stop.is_set():
                    version = self.watch_once(version)
                    failures = 0
            except _Gone:
                continue
            except Exception as exc:  # API errors, connection errors, bad JSON: back off, relist
                if self._stop.is_set():
                    return
                failures += 1
                self.failures += 1
                log.warning("kubernetes discovery of %s failed (%s); retrying", self.service, exc)
                self._stop.wait(min(self.backoff[1], self.backoff[0] * 2 ** min(failures - 1, 20)))

    def list_call(self) -> Any:
        return self.api.list_namespaced_endpoint_slice(
            self.namespace,
            label_selector=f"{SERVICE_LABEL}={self.service}",
            _preload_content=False,
            _request_timeout=(5, 30),
        )

    def watch_call(self, version: str) -> Any:
        return self.api.list_namespaced_endpoint_slice(
            self.namespace,
            label_selector=f"{SERVICE_LABEL}={self.service}",
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=version,
            timeout_seconds=self.watch_timeout_s,
            _preload_content=False,
            _request_timeout=(5, self.watch_timeout_s + 10),
        )

    def list_once(self) -> str:
        """List the Service's slices, publish the URLs; returns the list's resourceVersion."""
        resp: Any = self.list_call()
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        self.table.reset(body.get("items") or [])
        self.lists += 1
        self._publish()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def watch_once(self, version: str) -> str:
        """Follow changes from ``version`` until the server ends the watch; returns the last version."""
        resp: Any = self.watch_call(version)
        self._resp = resp
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    break
                version = self._on_line(line, version)
        finally:
            self._resp = None
            resp.release_conn()
        return version

    def _on_line(self, line: str | bytes, version: str) -> str:
        if not line or not line.strip():
            return version
        event = json.loads(line)
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == GONE:
                raise _Gone
            raise ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
        self.events += 1
        if self.table.apply(str(kind), obj):
            self._publish()
        return _version(obj) or version

    def _publish(self) -> None:
        if self._loop is not None and not self._stop.is_set():
            self._loop.call_soon_threadsafe(self.membership.replace, self.table.urls())
        elif self._loop is None:
            self.membership.replace(self.table.urls())


class InferencePoolDiscovery(EndpointSliceDiscovery):
    """Keeps ``membership`` equal to the ready Pods that the InferencePool ``pool`` in ``namespace``
    selects, on each of its target ports. The pool is read before each list and each watch (a watch lasts
    ``watch_timeout_s``): a changed selector or port list relists; a pool that is missing or invalid is an
    error like any other (backoff, the workers stay)."""

    def __init__(
        self,
        api: CoreV1Api,
        custom: CustomObjectsApi,
        namespace: str,
        pool: str,
        membership: Membership,
        *,
        scheme: str = "http",
        watch_timeout_s: int = 60,
        max_pods: int = 1024,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        super().__init__(
            api,  # type: ignore[arg-type]
            namespace,
            pool,
            membership,
            scheme=scheme,
            watch_timeout_s=watch_timeout_s,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
        )
        self.core, self.custom = api, custom
        self.pods = PodTable(max_pods, None, scheme)
        self.table = self.pods

    def read_target(self) -> PoolTarget:
        obj: Any = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.service, _request_timeout=(5, 30)
        )
        return pool_target(obj)

    def list_call(self) -> Any:
        self.pods.target = self.read_target()
        return self.core.list_namespaced_pod(
            self.namespace,
            label_selector=self.pods.target.selector,
            _preload_content=False,
            _request_timeout=(5, 30),
        )

    def watch_call(self, version: str) -> Any:
        target = self.read_target()
        if target != self.pods.target:
            log.info("inference pool %s changed its selector or ports; listing again", self.service)
            raise _Gone
        return self.core.list_namespaced_pod(
            self.namespace,
            label_selector=target.selector,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=version,
            timeout_seconds=self.watch_timeout_s,
            _preload_content=False,
            _request_timeout=(5, self.watch_timeout_s + 10),
        )


def _version(obj: Mapping[str, Any]) -> str | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return str(value) if value else None


def _abort(resp: Any) -> None:
    """Unblock a watch read from another thread (as ``kubernetes.watch.Watch.stop`` does)."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
