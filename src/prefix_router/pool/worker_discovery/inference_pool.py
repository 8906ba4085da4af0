"""``InferencePool`` objects (``inference.networking.k8s.io/v1``) and Pods (``v1``), as the API server sends
them, to worker URLs. Pure.

A pool names its model servers by ``spec.selector.matchLabels`` and the ports they serve on by
``spec.targetPorts[].number``; every ready Pod it selects (phase Running, condition Ready, a Pod IP, not
being deleted) is a worker on each target port: ``scheme://podIP:port``. A Pod labelled ``llm-d.ai/role``
(``prefill``, ``decode`` or ``both``: llm-d's label for prefill/decode disaggregation) gives its workers
that role (``docs/disaggregation.md``); read when a worker is added (a label changed later needs the pod
restarted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prefix_router.pool.worker_discovery.dns import address_url

GROUP, VERSION, PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"
ROLE_LABEL = "llm-d.ai/role"
ROLES = frozenset({"prefill", "decode", "both"})


class PoolInvalid(ValueError):
    """The InferencePool has no usable selector or target port."""


@dataclass(frozen=True, slots=True)
class PoolTarget:
    """What a pool selects: the label selector (``k=v,...``) and the target ports."""

    selector: str
    ports: tuple[int, ...]


def pool_target(obj: Mapping[str, Any]) -> PoolTarget:
    spec = obj.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not labels:
        raise PoolInvalid("spec.selector.matchLabels: empty (the pool would select every pod)")
    ports = tuple(
        p["number"]
        for p in spec.get("targetPorts") or []
        if isinstance(p, Mapping) and isinstance(p.get("number"), int) and 0 < p["number"] < 65536
    )
    if not ports:
        raise PoolInvalid("spec.targetPorts: no port number")
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return PoolTarget(selector, ports)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    if metadata.get("deletionTimestamp") or status.get("phase") != "Running" or not status.get("podIP"):
        return False
    conditions = status.get("conditions") or []
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions if isinstance(c, Mapping)
    )


def pod_urls(pod: Mapping[str, Any], ports: Iterable[int], scheme: str = "http") -> set[str]:
    if not pod_ready(pod):
        return set()
    address = str((pod.get("status") or {})["podIP"])
    return {address_url(address, port, scheme) for port in ports}


def pod_role(pod: Mapping[str, Any]) -> str | None:
    """The pod's disaggregation role (``ROLE_LABEL``), None when unlabelled or not a known role."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    role = labels.get(ROLE_LABEL) if isinstance(labels, Mapping) else None
    return role if role in ROLES else None


def pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


class PodTable:
    """The URLs of each selected Pod, by name (at most ``max_pods``; further pods are ignored and counted
    in ``ignored``). ``target`` changes with the pool (``reset`` then lists again)."""

    def __init__(self, max_pods: int, target: PoolTarget | None = None, scheme: str = "http") -> None:
        if max_pods <= 0:
            raise ValueError("max_pods must be positive")
        self.max_pods, self.target, self.scheme = max_pods, target, scheme
        self.pods: dict[str, set[str]] = {}
        self.pod_roles: dict[str, str] = {}  # of the pods in ``pods`` with a role label
        self.ignored = 0

    def reset(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.pods.clear()
        self.pod_roles.clear()
        for pod in items:
            self.apply("ADDED", pod)

    def apply(self, kind: str, pod: Mapping[str, Any]) -> bool:
        """One watch event (ADDED, MODIFIED, DELETED); True if the URLs may have changed."""
        name = pod_name(pod)
        if kind == "DELETED":
            self.pod_roles.pop(name, None)
            return self.pods.pop(name, None) is not None
        if kind not in ("ADDED", "MODIFIED") or self.target is None:
            return False
        if name not in self.pods and len(self.pods) >= self.max_pods:
            self.ignored += 1
            return False
        self.pods[name] = pod_urls(pod, self.target.ports, self.scheme)
        role = pod_role(pod)
        if role is None:
            self.pod_roles.pop(name, None)
        else:
            self.pod_roles[name] = role
        return True

    def role_of(self, url: str) -> str | None:
        """The role label of the pod serving ``url`` (None: none)."""
        return next((self.pod_roles.get(n) for n, urls in self.pods.items() if url in urls), None)

    def urls(self) -> set[str]:
        return set().union(*self.pods.values()) if self.pods else set()
