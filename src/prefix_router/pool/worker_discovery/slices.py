"""EndpointSlice objects (``discovery.k8s.io/v1``, as the API server sends them) to worker URLs. Pure.

A slice labelled ``llm-d.ai/role`` (the Service's labels are copied onto its slices by Kubernetes' slice
controller) gives its workers that role (``docs/disaggregation.md``), as an InferencePool pod's label does;
read when a worker is added."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prefix_router.pool.worker_discovery.dns import address_url
from prefix_router.pool.worker_discovery.inference_pool import pod_role


def slice_port(obj: Mapping[str, Any], port_name: str | None) -> int | None:
    """The slice's port named ``port_name`` (the first TCP port when None)."""
    for port in obj.get("ports") or []:
        if not isinstance(port, Mapping) or (port.get("protocol") or "TCP") != "TCP":
            continue
        if port_name is None or port.get("name") == port_name:
            number = port.get("port")
            return number if isinstance(number, int) else None
    return None


def serving(endpoint: Mapping[str, Any]) -> bool:
    """Ready (an absent ``ready`` means ready, per the API) and not terminating."""
    conditions = endpoint.get("conditions") or {}
    return conditions.get("ready") is not False and conditions.get("terminating") is not True


def slice_urls(obj: Mapping[str, Any], port_name: str | None = None, scheme: str = "http") -> set[str]:
    """``scheme://address:port`` of every serving endpoint address of the slice."""
    port = slice_port(obj, port_name)
    if port is None:
        return set()
    urls: set[str] = set()
    for endpoint in obj.get("endpoints") or []:
        if isinstance(endpoint, Mapping) and serving(endpoint):
            urls.update(address_url(str(a), port, scheme) for a in endpoint.get("addresses") or [])
    return urls


def slice_name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("name") or metadata.get("generateName") or "")


class SliceTable:
    """The URLs of each EndpointSlice of the Service, by slice name (at most ``max_slices``; further
    slices are ignored and counted in ``ignored``)."""

    def __init__(self, max_slices: int, port_name: str | None = None, scheme: str = "http") -> None:
        if max_slices <= 0:
            raise ValueError("max_slices must be positive")
        self.max_slices, self.port_name, self.scheme = max_slices, port_name, scheme
        self.slices: dict[str, set[str]] = {}
        self.roles: dict[str, str] = {}  # of the slices in ``slices`` with a role label
        self.ignored = 0

    def reset(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Replace everything with a full list."""
        self.slices.clear()
        self.roles.clear()
        for obj in items:
            self.apply("ADDED", obj)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> bool:
        """Apply one watch event (ADDED, MODIFIED, DELETED); True if the URLs may have changed."""
        name = slice_name(obj)
        if kind == "DELETED":
            self.roles.pop(name, None)
            return self.slices.pop(name, None) is not None
        if kind not in ("ADDED", "MODIFIED"):
            return False
        if name not in self.slices and len(self.slices) >= self.max_slices:
            self.ignored += 1
            return False
        self.slices[name] = slice_urls(obj, self.port_name, self.scheme)
        role = pod_role(obj)  # the same label, read from the slice's metadata
        if role is None:
            self.roles.pop(name, None)
        else:
            self.roles[name] = role
        return True

    def role_of(self, url: str) -> str | None:
        """The role label of the slice listing ``url`` (None: none)."""
        return next((self.roles.get(n) for n, urls in self.slices.items() if url in urls), None)

    def urls(self) -> set[str]:
        return set().union(*self.slices.values()) if self.slices else set()
